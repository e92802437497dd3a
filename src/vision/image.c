/* image.c — image bytes → 8-bit RGB, matching PIL (Image.open + ImageOps.exif_transpose +
 * convert("RGB"), which is what transformers' load_image does before the Qwen2-VL processor).
 *
 * Codecs: libjpeg-turbo for JPEG (the library PIL links, with PIL's default decode settings: ISLOW
 * IDCT, fancy upsampling, so the pixels are the same), libpng for PNG, giflib for GIF (only the
 * LZW stream: the canvas, palette and transparency rules are PIL's, written here), libwebp for WebP,
 * and a BMP reader written here, all linked like every other packaged library (scripts/install-deps.sh).
 *
 * Limits: image_decode reads the header with image_probe (pure parsing, no library) and checks
 * bytes, sides and pixels before any codec runs or any pixel buffer is allocated. */
#include "vision/image.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gif_lib.h>
#include <jpeglib.h>
#include <jerror.h>
#include <png.h>
#include <webp/decode.h>

#include "util/err.h"

image_limits image_default_limits(void) {
    image_limits l = {.max_bytes = (size_t)64 << 20, .max_side = 32768, .max_pixels = 89478485};
    return l;
}

const char *image_format_name(image_format f) {
    switch (f) {
    case IMAGE_FMT_PNG: return "PNG";
    case IMAGE_FMT_JPEG: return "JPEG";
    case IMAGE_FMT_GIF: return "GIF";
    case IMAGE_FMT_BMP: return "BMP";
    case IMAGE_FMT_WEBP: return "WebP";
    default: return "unknown";
    }
}

void image_free(image_rgb *img) {
    if (!img) return;
    free(img->pixels);
    memset(img, 0, sizeof *img);
}

/* ---- byte helpers (every read is bounds-checked by the caller) ---- */

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }
static uint32_t le32(const uint8_t *p) { return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0]; }
static uint32_t le24(const uint8_t *p) { return (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0]; }
static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[1] << 8 | p[0]); }
static uint16_t be16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }

/* ---- the codec libraries are linked (Makefile PKGS / LDLIBS) ---- */

/* ---- sniffing and header probes (pure) ---- */

image_format image_sniff(const uint8_t *d, size_t n) {
    if (n >= 8 && !memcmp(d, "\x89PNG\r\n\x1a\n", 8)) return IMAGE_FMT_PNG;
    if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return IMAGE_FMT_JPEG;
    if (n >= 6 && (!memcmp(d, "GIF87a", 6) || !memcmp(d, "GIF89a", 6))) return IMAGE_FMT_GIF;
    if (n >= 2 && d[0] == 'B' && d[1] == 'M') return IMAGE_FMT_BMP;
    if (n >= 12 && !memcmp(d, "RIFF", 4) && !memcmp(d + 8, "WEBP", 4)) return IMAGE_FMT_WEBP;
    return IMAGE_FMT_UNKNOWN;
}

static int probe_png(const uint8_t *d, size_t n, int *w, int *h, char *err, size_t errlen) {
    if (n < 33 || be32(d + 8) != 13 || memcmp(d + 12, "IHDR", 4))
        return ci_err(err, errlen, CINFER_EFORMAT, "PNG: no IHDR chunk at the start");
    uint32_t W_ = be32(d + 16), H_ = be32(d + 20);
    if (W_ == 0 || H_ == 0 || W_ > 0x7fffffffu || H_ > 0x7fffffffu)
        return ci_err(err, errlen, CINFER_EFORMAT, "PNG: bad size %ux%u in IHDR", W_, H_);
    *w = (int)W_;
    *h = (int)H_;
    return 0;
}

/* Walks the JPEG markers up to the first SOF (frame header). */
static int probe_jpeg(const uint8_t *d, size_t n, int *w, int *h, char *err, size_t errlen) {
    size_t i = 2;
    for (;;) {
        while (i < n && d[i] != 0xFF) i++; /* tolerate garbage between segments, as libjpeg does */
        while (i < n && d[i] == 0xFF) i++; /* fill bytes */
        if (i >= n) return ci_err(err, errlen, CINFER_EFORMAT, "JPEG: no frame header (SOF) before the end of data");
        uint8_t m = d[i++];
        if (m == 0xD8 || (m >= 0xD0 && m <= 0xD7) || m == 0x01) continue; /* no length field */
        if (m == 0xD9 || m == 0xDA) return ci_err(err, errlen, CINFER_EFORMAT, "JPEG: image data before a frame header");
        if (i + 2 > n) return ci_err(err, errlen, CINFER_EFORMAT, "JPEG: truncated marker segment");
        size_t len = be16(d + i);
        if (len < 2 || i + len > n) return ci_err(err, errlen, CINFER_EFORMAT, "JPEG: truncated marker segment");
        int sof = m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
        if (sof) {
            if (len < 8) return ci_err(err, errlen, CINFER_EFORMAT, "JPEG: short frame header");
            *h = be16(d + i + 3);
            *w = be16(d + i + 5);
            if (*w == 0 || *h == 0)
                return ci_err(err, errlen, CINFER_EFORMAT, "JPEG: frame size %dx%d (DNL-defined heights are not supported)", *w, *h);
            return 0;
        }
        i += len;
    }
}

static int probe_gif(const uint8_t *d, size_t n, int *w, int *h, char *err, size_t errlen) {
    if (n < 13) return ci_err(err, errlen, CINFER_EFORMAT, "GIF: truncated screen descriptor");
    *w = le16(d + 6);
    *h = le16(d + 8);
    if (*w == 0 || *h == 0) return ci_err(err, errlen, CINFER_EFORMAT, "GIF: empty logical screen %dx%d", *w, *h);
    return 0;
}

static int probe_webp(const uint8_t *d, size_t n, int *w, int *h, char *err, size_t errlen) {
    if (n < 20) return ci_err(err, errlen, CINFER_EFORMAT, "WebP: truncated RIFF header");
    const uint8_t *c = d + 12;
    size_t clen = le32(c + 4);
    size_t avail = n - 20;
    if (!memcmp(c, "VP8X", 4)) {
        if (clen < 10 || avail < 10) return ci_err(err, errlen, CINFER_EFORMAT, "WebP: truncated VP8X chunk");
        *w = (int)le24(c + 12) + 1;
        *h = (int)le24(c + 15) + 1;
    } else if (!memcmp(c, "VP8L", 4)) {
        if (clen < 5 || avail < 5 || c[8] != 0x2f) return ci_err(err, errlen, CINFER_EFORMAT, "WebP: bad VP8L header");
        uint32_t b = le32(c + 9);
        *w = (int)(b & 0x3fff) + 1;
        *h = (int)((b >> 14) & 0x3fff) + 1;
    } else if (!memcmp(c, "VP8 ", 4)) {
        if (clen < 10 || avail < 10 || c[11] != 0x9d || c[12] != 0x01 || c[13] != 0x2a)
            return ci_err(err, errlen, CINFER_EFORMAT, "WebP: bad VP8 frame header");
        *w = le16(c + 14) & 0x3fff;
        *h = le16(c + 16) & 0x3fff;
        if (*w == 0 || *h == 0) return ci_err(err, errlen, CINFER_EFORMAT, "WebP: empty frame");
    } else {
        return ci_err(err, errlen, CINFER_EFORMAT, "WebP: unknown first chunk");
    }
    return 0;
}

/* BMP headers, shared by the probe and the decoder. */
typedef struct bmp_info {
    int width, height, top_down, bpp;
    uint32_t compression, colors, pix_off, hdr_size, masks[4];
    int has_masks;
    size_t pal_off;
    int pal_entry; /* bytes per palette entry: 3 (OS/2 core header) or 4 */
} bmp_info;

static int bmp_parse(const uint8_t *d, size_t n, bmp_info *b, char *err, size_t errlen) {
    memset(b, 0, sizeof *b);
    if (n < 26 || d[0] != 'B' || d[1] != 'M') return ci_err(err, errlen, CINFER_EFORMAT, "BMP: truncated header");
    b->pix_off = le32(d + 10);
    b->hdr_size = le32(d + 14);
    if (b->hdr_size == 12) {
        b->width = le16(d + 18);
        b->height = le16(d + 20);
        b->bpp = le16(d + 24);
        b->pal_entry = 3;
    } else if (b->hdr_size >= 40 && b->hdr_size <= 124) {
        if (n < 14 + (size_t)b->hdr_size) return ci_err(err, errlen, CINFER_EFORMAT, "BMP: truncated info header");
        int32_t wv = (int32_t)le32(d + 18), hv = (int32_t)le32(d + 22);
        if (wv <= 0 || hv == 0 || hv == INT32_MIN) return ci_err(err, errlen, CINFER_EFORMAT, "BMP: bad size %dx%d", wv, hv);
        b->width = wv;
        b->top_down = hv < 0;
        b->height = hv < 0 ? -hv : hv;
        b->bpp = le16(d + 28);
        b->compression = le32(d + 30);
        b->colors = le32(d + 46);
        b->pal_entry = 4;
        if (b->compression == 3 || b->compression == 6) {
            size_t moff = 54, nm = b->compression == 6 ? 4 : 3;
            if (b->hdr_size == 40) {
                /* masks follow a plain BITMAPINFOHEADER */
                if (n < moff + 4 * nm) return ci_err(err, errlen, CINFER_EFORMAT, "BMP: truncated bitfield masks");
            } else if (b->hdr_size < 40 + 4 * nm) {
                return ci_err(err, errlen, CINFER_EFORMAT, "BMP: header too short for its bitfield masks");
            }
            for (size_t i = 0; i < nm; i++) b->masks[i] = le32(d + moff + 4 * i);
            b->has_masks = 1;
            b->pal_off = 14 + b->hdr_size + (b->hdr_size == 40 ? 4 * nm : 0);
        }
    } else {
        return ci_err(err, errlen, CINFER_EFORMAT, "BMP: unknown info header size %u", b->hdr_size);
    }
    if (!b->pal_off) b->pal_off = 14 + (size_t)b->hdr_size;
    if (b->width <= 0 || b->height <= 0) return ci_err(err, errlen, CINFER_EFORMAT, "BMP: bad size %dx%d", b->width, b->height);
    return 0;
}

int image_probe(const uint8_t *data, size_t size, image_format *fmt, int *width, int *height, char *err, size_t errlen) {
    image_format f = image_sniff(data, size);
    int w = 0, h = 0, rc;
    switch (f) {
    case IMAGE_FMT_PNG: rc = probe_png(data, size, &w, &h, err, errlen); break;
    case IMAGE_FMT_JPEG: rc = probe_jpeg(data, size, &w, &h, err, errlen); break;
    case IMAGE_FMT_GIF: rc = probe_gif(data, size, &w, &h, err, errlen); break;
    case IMAGE_FMT_WEBP: rc = probe_webp(data, size, &w, &h, err, errlen); break;
    case IMAGE_FMT_BMP: {
        bmp_info b;
        rc = bmp_parse(data, size, &b, err, errlen);
        w = b.width;
        h = b.height;
        break;
    }
    default:
        return ci_err(err, errlen, CINFER_EFORMAT, "not an image cinfer can read (PNG, JPEG, GIF, BMP or WebP expected)");
    }
    if (rc) return rc;
    *fmt = f;
    *width = w;
    *height = h;
    return 0;
}

static int check_dims(const image_limits *lim, image_format f, int64_t w, int64_t h, char *err, size_t errlen) {
    if (w > lim->max_side || h > lim->max_side)
        return ci_err(err, errlen, CINFER_ERANGE, "%s image %lldx%lld: a side is over the limit of %d pixels",
                      image_format_name(f), (long long)w, (long long)h, lim->max_side);
    if (w * h > lim->max_pixels)
        return ci_err(err, errlen, CINFER_ERANGE, "%s image %lldx%lld has %lld pixels, over the limit of %lld",
                      image_format_name(f), (long long)w, (long long)h, (long long)(w * h), (long long)lim->max_pixels);
    return 0;
}

static uint8_t *alloc_rgb(int w, int h, char *err, size_t errlen, int *rc) {
    /* w, h passed check_dims: w * h <= max_pixels, no overflow */
    uint8_t *p = malloc((size_t)w * (size_t)h * 3);
    if (!p) *rc = ci_err(err, errlen, CINFER_ENOMEM, "out of memory for a %dx%d image", w, h);
    return p;
}

/* PIL's palettes start as the gray ramp (i, i, i) and the file's entries overwrite the first ones:
 * an index past the file's palette reads the ramp. */
static void palette_ramp(uint8_t pal[256][3]) {
    for (int i = 0; i < 256; i++) pal[i][0] = pal[i][1] = pal[i][2] = (uint8_t)i;
}

/* ---- PNG ---- */

static int png_exif_orientation(const uint8_t *d, size_t n);

typedef struct png_ctx {
    const uint8_t *data;
    size_t size, off;
    jmp_buf jb;
    char msg[160];
    uint8_t *raw;
    uint8_t **rows;
} png_ctx;

static void png_read_cb(png_structp png, png_bytep out, size_t len) {
    png_ctx *c = png_get_io_ptr(png);
    if (len > c->size - c->off) png_error(png, "truncated PNG data");
    memcpy(out, c->data + c->off, len);
    c->off += len;
}

static void png_error_cb(png_structp png, png_const_charp msg) {
    png_ctx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    longjmp(c->jb, 1);
}

static void png_warning_cb(png_structp png, png_const_charp msg) { (void)png, (void)msg; }

/* The setjmp lives here with all state in *c, so nothing the longjmp crosses is a clobberable local. */
static int png_run(png_ctx *c, png_structp png, png_infop info, const image_limits *lim, image_rgb *out, char *err,
                   size_t errlen) {
    if (setjmp(c->jb)) return ci_err(err, errlen, CINFER_EFORMAT, "PNG: %s", c->msg);
    png_set_read_fn(png, c, png_read_cb);
    png_set_user_limits(png, (png_uint_32)lim->max_side, (png_uint_32)lim->max_side);
    png_set_chunk_malloc_max(png, (png_alloc_size_t)8 << 20); /* ancillary chunks (iCCP, zTXt) are bounded */
    png_read_info(png, info);
    png_uint_32 w, h;
    int depth, ctype, interlace;
    png_get_IHDR(png, info, &w, &h, &depth, &ctype, &interlace, NULL, NULL);
    int rc = check_dims(lim, IMAGE_FMT_PNG, w, h, err, errlen);
    if (rc) return rc;
    out->had_alpha = (ctype & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS);
    /* PIL: palette → its RGB entries, indices past the PLTE reading PIL's default gray ramp (i, i, i)
     * (so the palette is expanded here, not by libpng, which gives black); gray 1/2/4 bits →
     * v*255/(2^d-1); 16-bit samples → the high byte, except 16-bit gray which PIL opens as mode "I"
     * and clips to 255 when converting to RGB. Alpha and tRNS are ignored (convert("RGB") drops them). */
    int palette = ctype == PNG_COLOR_TYPE_PALETTE;
    uint8_t pal[256][3];
    if (palette) {
        palette_ramp(pal);
        png_colorp plte = NULL;
        int np = 0;
        if (png_get_PLTE(png, info, &plte, &np) && plte)
            for (int i = 0; i < np && i < 256; i++) pal[i][0] = plte[i].red, pal[i][1] = plte[i].green, pal[i][2] = plte[i].blue;
        png_set_packing(png); /* 1/2/4-bit indices → one byte each */
    }
    if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    size_t rowbytes = png_get_rowbytes(png, info);
    int ch = png_get_channels(png, info), bd = png_get_bit_depth(png, info);
    if (ch < 1 || ch > 4 || (bd != 8 && bd != 16) || rowbytes < (size_t)w * ch * (bd / 8) || (palette && (ch != 1 || bd != 8)))
        return ci_err(err, errlen, CINFER_EFORMAT, "PNG: unexpected layout after expansion (%d channels, %d bits)", ch, bd);
    c->raw = malloc(rowbytes * h);
    c->rows = malloc(sizeof(uint8_t *) * h);
    out->pixels = alloc_rgb((int)w, (int)h, err, errlen, &rc);
    if (!c->raw || !c->rows || !out->pixels) return rc ? rc : ci_err(err, errlen, CINFER_ENOMEM, "PNG: out of memory");
    for (png_uint_32 y = 0; y < h; y++) c->rows[y] = c->raw + y * rowbytes;
    png_read_image(png, c->rows);
    int step = ch * (bd / 8);
    for (png_uint_32 y = 0; y < h; y++) {
        const uint8_t *s = c->rows[y];
        uint8_t *o = out->pixels + (size_t)y * w * 3;
        for (png_uint_32 x = 0; x < w; x++, s += step, o += 3) {
            if (palette) {
                memcpy(o, pal[s[0]], 3);
            } else if (ch <= 2) {
                unsigned v = bd == 8 ? s[0] : (ch == 1 ? (be16(s) > 255 ? 255u : be16(s)) : s[0]);
                o[0] = o[1] = o[2] = (uint8_t)v;
            } else {
                int bs = bd / 8; /* high byte of each 16-bit sample is the first one */
                o[0] = s[0];
                o[1] = s[bs];
                o[2] = s[2 * bs];
            }
        }
    }
    out->width = (int)w;
    out->height = (int)h;
    out->orientation = png_exif_orientation(c->data, c->size);
    return 0;
}

static int decode_png(const uint8_t *data, size_t size, const image_limits *lim, image_rgb *out, char *err,
                      size_t errlen) {
    png_ctx c = {.data = data, .size = size};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &c, png_error_cb, png_warning_cb);
    if (!png) return ci_err(err, errlen, CINFER_ENOMEM, "PNG: cannot create the decoder");
    png_infop info = png_create_info_struct(png);
    int rc = info ? png_run(&c, png, info, lim, out, err, errlen)
                  : ci_err(err, errlen, CINFER_ENOMEM, "PNG: cannot create the decoder");
    png_destroy_read_struct(&png, info ? &info : NULL, NULL);
    free(c.raw);
    free(c.rows);
    return rc;
}

/* ---- JPEG ---- */

typedef struct jpeg_ctx {
    struct jpeg_error_mgr pub; /* first: libjpeg hands back a pointer to it */
    struct jpeg_progress_mgr progress;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX + 32];
    int truncated;
    uint8_t *row; /* [width * 4] scratch for gray / CMYK rows */
} jpeg_ctx;

static void jpeg_error_exit_cb(j_common_ptr ci) {
    jpeg_ctx *c = (jpeg_ctx *)ci->err;
    c->pub.format_message(ci, c->msg);
    longjmp(c->jb, 1);
}

static void jpeg_emit_cb(j_common_ptr ci, int level) {
    jpeg_ctx *c = (jpeg_ctx *)ci->err;
    /* libjpeg pads a truncated stream with an EOI and only warns; PIL refuses it ("image file is
     * truncated"), so the warning becomes an error after the current call. Other warnings
     * (corrupt data it recovers from) pass, as in PIL. */
    if (level < 0 && c->pub.msg_code == JWRN_JPEG_EOF) c->truncated = 1;
}

static void jpeg_output_cb(j_common_ptr ci) { (void)ci; }

/* A progressive JPEG can carry thousands of tiny scans that each cost a pass over the whole
 * coefficient buffer (libjpeg-turbo's documented DoS); no real encoder writes more than a few dozen. */
static void jpeg_progress_cb(j_common_ptr ci) {
    j_decompress_ptr d = (j_decompress_ptr)ci;
    jpeg_ctx *c = (jpeg_ctx *)ci->err;
    if (ci->is_decompressor && d->input_scan_number > 500) {
        snprintf(c->msg, sizeof c->msg, "more than 500 progressive scans");
        longjmp(c->jb, 1);
    }
}

/* EXIF orientation (tag 0x0112) from an EXIF payload: a TIFF structure, with or without the
 * "Exif\0\0" prefix JPEG's APP1 carries (PIL strips it the same way). 0 when absent or malformed. */
static int exif_orientation(const uint8_t *p, size_t n) {
    if (n >= 6 && !memcmp(p, "Exif\0\0", 6)) p += 6, n -= 6;
    if (n < 8) return 0;
    int le;
    if (!memcmp(p, "II*\0", 4)) le = 1;
    else if (!memcmp(p, "MM\0*", 4)) le = 0;
    else return 0;
    uint32_t ifd = le ? le32(p + 4) : be32(p + 4);
    if (ifd > n || n - ifd < 2) return 0;
    unsigned cnt = le ? le16(p + ifd) : be16(p + ifd);
    for (unsigned i = 0; i < cnt; i++) {
        size_t e = (size_t)ifd + 2 + (size_t)i * 12;
        if (e + 12 > n) return 0;
        unsigned tag = le ? le16(p + e) : be16(p + e);
        unsigned type = le ? le16(p + e + 2) : be16(p + e + 2);
        if (tag != 0x0112) continue;
        uint32_t v;
        if (type == 3) v = le ? le16(p + e + 8) : be16(p + e + 8); /* SHORT */
        else if (type == 4) v = le ? le32(p + e + 8) : be32(p + e + 8); /* LONG */
        else return 0;
        return v >= 1 && v <= 8 ? (int)v : 0;
    }
    return 0;
}

/* PNG: the first eXIf chunk, before or after the image data (PIL reads both). */
static int png_exif_orientation(const uint8_t *d, size_t n) {
    size_t i = 8;
    while (i + 12 <= n) {
        size_t len = be32(d + i);
        if (len > n - i - 12) return 0;
        if (!memcmp(d + i + 4, "eXIf", 4)) return exif_orientation(d + i + 8, len);
        if (!memcmp(d + i + 4, "IEND", 4)) return 0;
        i += 12 + len;
    }
    return 0;
}

/* WebP: the EXIF chunk of an extended (VP8X) file. */
static int webp_exif_orientation(const uint8_t *d, size_t n) {
    size_t i = 12;
    while (i + 8 <= n) {
        size_t len = le32(d + i + 4);
        if (len > n - i - 8) return 0;
        if (!memcmp(d + i, "EXIF", 4)) return exif_orientation(d + i + 8, len);
        i += 8 + len + (len & 1);
    }
    return 0;
}

static int jpeg_run(jpeg_ctx *c, struct jpeg_decompress_struct *ci, const uint8_t *data, size_t size,
                    const image_limits *lim, image_rgb *out, char *err, size_t errlen) {
    if (setjmp(c->jb)) return ci_err(err, errlen, CINFER_EFORMAT, "JPEG: %s", c->msg);
    jpeg_CreateDecompress(ci, JPEG_LIB_VERSION, sizeof *ci);
    c->progress.progress_monitor = jpeg_progress_cb;
    ci->progress = &c->progress;
    jpeg_mem_src(ci, data, (unsigned long)size);
    jpeg_save_markers(ci, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(ci, TRUE);
    if (c->truncated) return ci_err(err, errlen, CINFER_EFORMAT, "JPEG: truncated data");
    int rc = check_dims(lim, IMAGE_FMT_JPEG, ci->image_width, ci->image_height, err, errlen);
    if (rc) return rc;
    int nc = ci->num_components;
    /* PIL: 1 component → "L", 3 → "RGB" (libjpeg's own YCbCr/RGB handling), 4 → "CMYK" read inverted
     * (Adobe convention, rawmode "CMYK;I"). Output settings otherwise libjpeg's defaults, as PIL
     * leaves them: JDCT_ISLOW, fancy upsampling, block smoothing. */
    if (nc == 1) ci->out_color_space = JCS_GRAYSCALE;
    else if (nc == 3) ci->out_color_space = JCS_RGB;
    else if (nc == 4) ci->out_color_space = JCS_CMYK;
    else return ci_err(err, errlen, CINFER_EUNSUPPORTED, "JPEG: %d color components", nc);
    for (jpeg_saved_marker_ptr m = ci->marker_list; m; m = m->next)
        if (m->marker == JPEG_APP0 + 1 && (out->orientation = exif_orientation(m->data, m->data_length))) break;
    jpeg_start_decompress(ci);
    if (c->truncated) return ci_err(err, errlen, CINFER_EFORMAT, "JPEG: truncated data");
    int w = (int)ci->output_width, h = (int)ci->output_height;
    if ((rc = check_dims(lim, IMAGE_FMT_JPEG, w, h, err, errlen))) return rc;
    if (!(out->pixels = alloc_rgb(w, h, err, errlen, &rc))) return rc;
    if (nc != 3 && !(c->row = malloc((size_t)w * 4)))
        return ci_err(err, errlen, CINFER_ENOMEM, "JPEG: out of memory");
    while (ci->output_scanline < ci->output_height) {
        int y = (int)ci->output_scanline;
        uint8_t *o = out->pixels + (size_t)y * w * 3;
        JSAMPROW r = nc == 3 ? o : c->row;
        if (jpeg_read_scanlines(ci, &r, 1) != 1) break;
        if (c->truncated) return ci_err(err, errlen, CINFER_EFORMAT, "JPEG: truncated data");
        if (nc == 1) {
            for (int x = 0; x < w; x++) o[3 * x] = o[3 * x + 1] = o[3 * x + 2] = c->row[x];
        } else if (nc == 4) {
            /* PIL's cmyk2rgb on the inverted samples: out = nk - nk*c/255 with its MULDIV255 rounding. */
            for (int x = 0; x < w; x++) {
                const uint8_t *s = c->row + 4 * x;
                int nk = s[3]; /* 255 - (255 - raw k) */
                for (int k = 0; k < 3; k++) {
                    int cc = 255 - s[k], t = cc * nk + 128;
                    int v = nk - (((t >> 8) + t) >> 8);
                    o[3 * x + k] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
                }
            }
        }
    }
    if (ci->output_scanline < ci->output_height || c->truncated)
        return ci_err(err, errlen, CINFER_EFORMAT, "JPEG: truncated data");
    out->width = w;
    out->height = h;
    return 0;
}

static int decode_jpeg(const uint8_t *data, size_t size, const image_limits *lim, image_rgb *out, char *err,
                       size_t errlen) {
    struct jpeg_decompress_struct ci;
    jpeg_ctx c;
    memset(&ci, 0, sizeof ci);
    memset(&c, 0, sizeof c);
    ci.err = jpeg_std_error(&c.pub);
    c.pub.error_exit = jpeg_error_exit_cb;
    c.pub.emit_message = jpeg_emit_cb;
    c.pub.output_message = jpeg_output_cb;
    int rc = jpeg_run(&c, &ci, data, size, lim, out, err, errlen);
    jpeg_destroy_decompress(&ci);
    free(c.row);
    return rc;
}

/* ---- GIF (first frame, PIL's canvas rules) ---- */

typedef struct gif_src {
    const uint8_t *data;
    size_t size, off;
} gif_src;

static int gif_read_cb(GifFileType *gf, GifByteType *buf, int len) {
    gif_src *s = gf->UserData;
    if (len < 0) return 0;
    size_t k = (size_t)len;
    if (k > s->size - s->off) k = s->size - s->off;
    memcpy(buf, s->data + s->off, k);
    s->off += k;
    return (int)k;
}

static int gif_fail(GifFileType *gf, const char *what, char *err, size_t errlen) {
    const char *why = GifErrorString(gf->Error);
    return ci_err(err, errlen, CINFER_EFORMAT, "GIF: %s: %s", what, why ? why : "error");
}

static int gif_run(GifFileType *gf, const image_limits *lim, image_rgb *out, uint8_t **idx_out, char *err,
                   size_t errlen) {
    int transparency = -1;
    GifRecordType rt;
    for (;;) {
        if (DGifGetRecordType(gf, &rt) == GIF_ERROR) return gif_fail(gf, "reading a record", err, errlen);
        if (rt == TERMINATE_RECORD_TYPE) return ci_err(err, errlen, CINFER_EFORMAT, "GIF: no image in the file");
        if (rt == EXTENSION_RECORD_TYPE) {
            int code;
            GifByteType *ext;
            if (DGifGetExtension(gf, &code, &ext) == GIF_ERROR) return gif_fail(gf, "reading an extension", err, errlen);
            if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4) transparency = (ext[1] & 1) ? ext[4] : -1;
            while (ext) {
                if (DGifGetExtensionNext(gf, &ext) == GIF_ERROR) return gif_fail(gf, "reading an extension", err, errlen);
            }
            continue;
        }
        if (rt == IMAGE_DESC_RECORD_TYPE) break;
    }
    if (DGifGetImageDesc(gf) == GIF_ERROR) return gif_fail(gf, "reading the image descriptor", err, errlen);
    GifImageDesc *im = &gf->Image;
    /* PIL grows the canvas to hold a first frame that extends past the logical screen. */
    int64_t cw = gf->SWidth, ch = gf->SHeight;
    if ((int64_t)im->Left + im->Width > cw) cw = (int64_t)im->Left + im->Width;
    if ((int64_t)im->Top + im->Height > ch) ch = (int64_t)im->Top + im->Height;
    int rc = check_dims(lim, IMAGE_FMT_GIF, cw, ch, err, errlen);
    if (rc) return rc;
    int W_ = (int)cw, H_ = (int)ch;
    /* The canvas starts as index 0, or as the transparent index when the frame has one (PIL). */
    uint8_t *idx = malloc((size_t)W_ * H_);
    if (!idx) return ci_err(err, errlen, CINFER_ENOMEM, "GIF: out of memory");
    *idx_out = idx;
    memset(idx, transparency >= 0 ? transparency : 0, (size_t)W_ * H_);
    if (im->Width > 0 && im->Height > 0) {
        static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
        int passes = im->Interlace ? 4 : 1;
        for (int p = 0; p < passes; p++) {
            int y0 = im->Interlace ? start[p] : 0, dy = im->Interlace ? step[p] : 1;
            for (int y = y0; y < im->Height; y += dy) {
                GifPixelType *row = idx + (size_t)(im->Top + y) * W_ + im->Left;
                if (DGifGetLine(gf, row, im->Width) == GIF_ERROR) return gif_fail(gf, "decoding pixels", err, errlen);
            }
        }
    }
    /* Palette: the frame's own, else the global one, over PIL's gray ramp (no palette at all is
     * PIL's mode "L": the index is the gray level). */
    const ColorMapObject *cm = im->ColorMap ? im->ColorMap : gf->SColorMap;
    uint8_t pal[256][3];
    palette_ramp(pal);
    if (cm && cm->Colors) {
        int nc = cm->ColorCount < 256 ? cm->ColorCount : 256;
        for (int i = 0; i < nc; i++) {
            pal[i][0] = cm->Colors[i].Red;
            pal[i][1] = cm->Colors[i].Green;
            pal[i][2] = cm->Colors[i].Blue;
        }
    }
    if (!(out->pixels = alloc_rgb(W_, H_, err, errlen, &rc))) return rc;
    for (size_t i = 0; i < (size_t)W_ * H_; i++) memcpy(out->pixels + 3 * i, pal[idx[i]], 3);
    out->width = W_;
    out->height = H_;
    out->had_alpha = transparency >= 0;
    return 0;
}

static int decode_gif(const uint8_t *data, size_t size, const image_limits *lim, image_rgb *out, char *err,
                      size_t errlen) {
    gif_src s = {data, size, 0};
    int e = 0;
    GifFileType *gf = DGifOpen(&s, gif_read_cb, &e);
    if (!gf) {
        const char *why = GifErrorString(e);
        return ci_err(err, errlen, e == D_GIF_ERR_NOT_ENOUGH_MEM ? CINFER_ENOMEM : CINFER_EFORMAT, "GIF: %s",
                      why ? why : "cannot open");
    }
    uint8_t *idx = NULL;
    int rc = gif_run(gf, lim, out, &idx, err, errlen);
    free(idx);
    DGifCloseFile(gf, &e);
    return rc;
}

/* ---- WebP (still images) ---- */

static int decode_webp(const uint8_t *data, size_t size, const image_limits *lim, image_rgb *out, char *err,
                       size_t errlen) {
    WebPBitstreamFeatures f;
    VP8StatusCode st = WebPGetFeaturesInternal(data, size, &f, WEBP_DECODER_ABI_VERSION);
    if (st != VP8_STATUS_OK) return ci_err(err, errlen, CINFER_EFORMAT, "WebP: bad header (status %d)", (int)st);
    if (f.has_animation) return ci_err(err, errlen, CINFER_EUNSUPPORTED, "WebP: animated images are not supported");
    int rc = check_dims(lim, IMAGE_FMT_WEBP, f.width, f.height, err, errlen);
    if (rc) return rc;
    if (!(out->pixels = alloc_rgb(f.width, f.height, err, errlen, &rc))) return rc;
    size_t n = (size_t)f.width * f.height * 3;
    /* RGB output = the RGB of PIL's RGBA decode (libwebp converts per pixel; alpha is a separate plane). */
    if (!WebPDecodeRGBInto(data, size, out->pixels, n, f.width * 3))
        return ci_err(err, errlen, CINFER_EFORMAT, "WebP: corrupt or truncated data");
    out->width = f.width;
    out->height = f.height;
    out->had_alpha = f.has_alpha;
    out->orientation = webp_exif_orientation(data, size);
    return 0;
}

/* ---- BMP (uncompressed and bitfields; PIL's layouts) ---- */

static int mask_shift(uint32_t m) {
    int s = 0;
    while (s < 32 && !((m >> s) & 1)) s++;
    return s;
}

static int decode_bmp(const uint8_t *data, size_t size, const image_limits *lim, image_rgb *out, char *err,
                      size_t errlen) {
    bmp_info b;
    int rc = bmp_parse(data, size, &b, err, errlen);
    if (rc) return rc;
    if ((rc = check_dims(lim, IMAGE_FMT_BMP, b.width, b.height, err, errlen))) return rc;
    if (b.compression == 1 || b.compression == 2)
        return ci_err(err, errlen, CINFER_EUNSUPPORTED, "BMP: RLE compression is not supported");
    if (b.compression != 0 && b.compression != 3 && b.compression != 6)
        return ci_err(err, errlen, CINFER_EUNSUPPORTED, "BMP: compression %u is not supported", b.compression);
    int bpp = b.bpp;
    if (bpp != 1 && bpp != 4 && bpp != 8 && bpp != 16 && bpp != 24 && bpp != 32)
        return ci_err(err, errlen, CINFER_EUNSUPPORTED, "BMP: %d bits per pixel", bpp);
    uint8_t pal[256][3];
    palette_ramp(pal);
    if (bpp <= 8) {
        uint32_t nc = b.colors ? b.colors : 1u << bpp;
        if (nc > 256) return ci_err(err, errlen, CINFER_EFORMAT, "BMP: %u palette entries", nc);
        if (b.pal_off > size || (size - b.pal_off) / (size_t)b.pal_entry < nc)
            return ci_err(err, errlen, CINFER_EFORMAT, "BMP: truncated palette");
        for (uint32_t i = 0; i < nc; i++) {
            const uint8_t *e = data + b.pal_off + (size_t)i * b.pal_entry;
            pal[i][0] = e[2];
            pal[i][1] = e[1];
            pal[i][2] = e[0];
        }
    }
    /* Bit masks for 16/32 bits: BI_RGB means 5-5-5 (16) or 8-8-8 (32); BITFIELDS must be a layout PIL
     * reads: whole bytes for 32 bits, 5-6-5 or 5-5-5 for 16. */
    uint32_t mr = 0, mg = 0, mb = 0;
    if (bpp == 16 || bpp == 32) {
        if (b.has_masks) {
            mr = b.masks[0];
            mg = b.masks[1];
            mb = b.masks[2];
        } else if (bpp == 16) {
            mr = 0x7c00, mg = 0x03e0, mb = 0x001f;
        } else {
            mr = 0xff0000, mg = 0xff00, mb = 0xff;
        }
        int ok;
        if (bpp == 32) {
            ok = 1;
            uint32_t m3[3] = {mr, mg, mb};
            for (int i = 0; i < 3; i++) {
                int s = mask_shift(m3[i]);
                if (s > 24 || s % 8 || m3[i] != (0xffu << s)) ok = 0;
            }
        } else {
            ok = (mr == 0xf800 && mg == 0x07e0 && mb == 0x001f) || (mr == 0x7c00 && mg == 0x03e0 && mb == 0x001f);
        }
        if (!ok)
            return ci_err(err, errlen, CINFER_EUNSUPPORTED, "BMP: bitfield layout %08x/%08x/%08x is not supported", mr, mg,
                          mb);
    } else if (b.has_masks) {
        return ci_err(err, errlen, CINFER_EFORMAT, "BMP: bitfields with %d bits per pixel", bpp);
    }
    size_t stride = (((size_t)b.width * bpp + 31) >> 3) & ~(size_t)3;
    if (b.pix_off > size || (size - b.pix_off) / stride < (size_t)b.height)
        return ci_err(err, errlen, CINFER_EFORMAT, "BMP: truncated pixel data");
    if (!(out->pixels = alloc_rgb(b.width, b.height, err, errlen, &rc))) return rc;
    int sr = mask_shift(mr), sg = mask_shift(mg), sb = mask_shift(mb);
    unsigned maxr = sr < 32 ? mr >> sr : 0, maxg = sg < 32 ? mg >> sg : 0, maxb = sb < 32 ? mb >> sb : 0;
    for (int y = 0; y < b.height; y++) {
        const uint8_t *s = data + b.pix_off + (size_t)(b.top_down ? y : b.height - 1 - y) * stride;
        uint8_t *o = out->pixels + (size_t)y * b.width * 3;
        for (int x = 0; x < b.width; x++, o += 3) {
            if (bpp <= 8) {
                unsigned bit = (unsigned)x * bpp;
                unsigned v = (s[bit >> 3] >> (8 - bpp - (bit & 7))) & ((1u << bpp) - 1);
                memcpy(o, pal[v], 3);
            } else if (bpp == 24) {
                o[0] = s[3 * x + 2];
                o[1] = s[3 * x + 1];
                o[2] = s[3 * x];
            } else {
                uint32_t v = bpp == 16 ? le16(s + 2 * x) : le32(s + 4 * (size_t)x);
                /* PIL unpacks n-bit fields as v * 255 / (2^n - 1) (exact for 8-bit fields) */
                o[0] = (uint8_t)(((v & mr) >> sr) * 255 / maxr);
                o[1] = (uint8_t)(((v & mg) >> sg) * 255 / maxg);
                o[2] = (uint8_t)(((v & mb) >> sb) * 255 / maxb);
            }
        }
    }
    out->width = b.width;
    out->height = b.height;
    out->had_alpha = bpp == 32 && b.has_masks && b.hdr_size >= 56 && b.masks[3] != 0;
    return 0;
}

/* ---- EXIF orientation, as ImageOps.exif_transpose ---- */

static int apply_orientation(image_rgb *img, char *err, size_t errlen) {
    int o = img->orientation;
    if (o < 2 || o > 8) return 0;
    int W_ = img->width, H_ = img->height;
    int swap = o >= 5; /* TRANSPOSE, ROTATE_270, TRANSVERSE, ROTATE_90 exchange the sides */
    int ow = swap ? H_ : W_, oh = swap ? W_ : H_;
    uint8_t *dst = malloc((size_t)W_ * H_ * 3);
    if (!dst) return ci_err(err, errlen, CINFER_ENOMEM, "out of memory rotating a %dx%d image", W_, H_);
    for (int y = 0; y < oh; y++)
        for (int x = 0; x < ow; x++) {
            int sx, sy;
            switch (o) {
            case 2: sx = W_ - 1 - x, sy = y; break;          /* FLIP_LEFT_RIGHT */
            case 3: sx = W_ - 1 - x, sy = H_ - 1 - y; break; /* ROTATE_180 */
            case 4: sx = x, sy = H_ - 1 - y; break;          /* FLIP_TOP_BOTTOM */
            case 5: sx = y, sy = x; break;                   /* TRANSPOSE */
            case 6: sx = y, sy = H_ - 1 - x; break;          /* ROTATE_270 (clockwise 90) */
            case 7: sx = W_ - 1 - y, sy = H_ - 1 - x; break; /* TRANSVERSE */
            default: sx = W_ - 1 - y, sy = x; break;         /* 8: ROTATE_90 (counter-clockwise) */
            }
            memcpy(dst + ((size_t)y * ow + x) * 3, img->pixels + ((size_t)sy * W_ + sx) * 3, 3);
        }
    free(img->pixels);
    img->pixels = dst;
    img->width = ow;
    img->height = oh;
    return 0;
}

/* ---- entry point ---- */

int image_decode(const uint8_t *data, size_t size, const image_limits *lim, image_rgb *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    image_limits def = image_default_limits();
    if (!lim) lim = &def;
    if (size > lim->max_bytes)
        return ci_err(err, errlen, CINFER_ERANGE, "image of %zu bytes is over the limit of %zu", size, lim->max_bytes);
    image_format f;
    int w, h;
    int rc = image_probe(data, size, &f, &w, &h, err, errlen);
    if (rc) return rc;
    if ((rc = check_dims(lim, f, w, h, err, errlen))) return rc;
    switch (f) {
    case IMAGE_FMT_PNG: rc = decode_png(data, size, lim, out, err, errlen); break;
    case IMAGE_FMT_JPEG: rc = decode_jpeg(data, size, lim, out, err, errlen); break;
    case IMAGE_FMT_GIF: rc = decode_gif(data, size, lim, out, err, errlen); break;
    case IMAGE_FMT_WEBP: rc = decode_webp(data, size, lim, out, err, errlen); break;
    default: rc = decode_bmp(data, size, lim, out, err, errlen); break;
    }
    if (!rc) rc = apply_orientation(out, err, errlen);
    if (rc) {
        image_free(out);
        return rc;
    }
    out->format = f;
    return 0;
}
