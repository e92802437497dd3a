/* web.c — see web.h. The assets are arrays generated from src/server/web/ at build time. */
#include "server/web.h"

#include <string.h>

#include "web_assets.h"

int web_asset(const char *path, const unsigned char **data, size_t *len, const char **type) {
    size_t n = strcspn(path, "?#");
    static const struct {
        const char *path, *type;
        const unsigned char *data;
        const unsigned int *len;
    } assets[] = {
        {"/", "text/html; charset=utf-8", web_index_html, &web_index_html_len},
        {"/index.html", "text/html; charset=utf-8", web_index_html, &web_index_html_len},
        {"/app.js", "text/javascript; charset=utf-8", web_app_js, &web_app_js_len},
        {"/app.css", "text/css; charset=utf-8", web_app_css, &web_app_css_len},
    };
    for (size_t i = 0; i < sizeof assets / sizeof assets[0]; i++)
        if (strlen(assets[i].path) == n && !strncmp(assets[i].path, path, n)) {
            *data = assets[i].data;
            *len = *assets[i].len;
            *type = assets[i].type;
            return 1;
        }
    return 0;
}
