/* web.h — the browser chat page (src/server/web/: index.html, app.css, app.js), embedded into the binary at
 * build time (the Makefile turns the files into $(BUILD)/gen/web_assets.h with xxd -i). */
#ifndef CI_SERVER_WEB_H
#define CI_SERVER_WEB_H

#include <stddef.h>

/* The Content-Security-Policy the page is served with: its own script, style and API only. */
#define WEB_CSP                                                                                              \
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "    \
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

/* The asset at url path ("/" is the page itself): 1 with its bytes and content type, 0 when there is none. */
int web_asset(const char *path, const unsigned char **data, size_t *len, const char **type);

#endif
