#!/usr/bin/python3
"""image_goldens.py — test images and PIL reference outputs for src/vision/image.c and preprocess.c.

Run on the dev machine (CPU only) with Debian's python3-pil and python3-numpy:
    /usr/bin/python3 tools/oracle/image_goldens.py [--out tests/fixtures/images]
It writes the images it generates and goldens.json: for every image, the checksum of the pixels
PIL gives (the decode reference), of PIL's BICUBIC resize to the smart_resize size (the resample
reference) and of the final pixel_values (the processor reference), for two processor configs.

Which transformers code the reference mirrors (the slow / PIL path, transformers v5
Qwen2VLImageProcessorPil with PilBackend, equivalently the 4.x Qwen2VLImageProcessor):
  load_image:       PIL.Image.open -> ImageOps.exif_transpose -> .convert("RGB")
  convert_to_rgb:   image.convert("RGB") (current transformers; no white compositing)
  smart_resize:     image_processing_qwen2_vl.smart_resize (round half-even, max(factor, floor) when
                    over max_pixels, ceil when under min_pixels, aspect ratio > 200 refused)
  resize:           image_transforms.resize -> PIL Image.resize((w, h), BICUBIC), reducing_gap None
  rescale:          image.astype(float64) * rescale_factor -> astype(float32)
  normalize:        ((image.T - mean) / std).T in float32 (mean/std cast to float32)
  patchify:         expand to 2 frames, reshape (1, gt, T, C, gh/M, M, P, gw/M, M, P),
                    transpose (0, 1, 4, 7, 5, 8, 3, 2, 6, 9), reshape (gt*gh*gw, C*T*P*P)
The transformers-run oracle (tools/oracle on the GPU machine) is a separate, later check.

Checksum (same in tests/unit/test_image.c): bytes zero-padded to a multiple of 8, read as
little-endian u64 words w_i; x = (w_i ^ (i * 0x9E3779B97F4A7C15)) * 0xBF58476D1CE4E5B9;
x ^= x >> 29; sum of x over i mod 2^64, then ^ (length in bytes).
"""
import argparse
import io
import json
import math
import os
import struct
import zlib

import numpy as np
from PIL import Image, ImageOps, features

K1 = np.uint64(0x9E3779B97F4A7C15)
K2 = np.uint64(0xBF58476D1CE4E5B9)


def csum(buf: bytes) -> str:
    n = len(buf)
    pad = (-n) % 8
    w = np.frombuffer(buf + b"\0" * pad, dtype="<u8")
    i = np.arange(len(w), dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (w ^ (i * K1)) * K2
        x ^= x >> np.uint64(29)
        s = int(x.sum(dtype=np.uint64)) ^ n
    return "%016x" % (s & 0xFFFFFFFFFFFFFFFF)


def smart_resize(h, w, factor, min_pixels, max_pixels):
    if max(h, w) / min(h, w) > 200:
        return None
    hb = round(h / factor) * factor
    wb = round(w / factor) * factor
    if hb * wb > max_pixels:
        beta = math.sqrt((h * w) / max_pixels)
        hb = max(factor, math.floor(h / beta / factor) * factor)
        wb = max(factor, math.floor(w / beta / factor) * factor)
    elif hb * wb < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        hb = math.ceil(h * beta / factor) * factor
        wb = math.ceil(w * beta / factor) * factor
    return hb, wb


def pixel_values(resized_rgb: np.ndarray, P=16, T=2, M=2, scale=1 / 255, mean=(0.5,) * 3, std=(0.5,) * 3):
    img = resized_rgb.transpose(2, 0, 1)  # CHW, as the processor's channels-first arrays
    img = (img.astype(np.float64) * scale).astype(np.float32)
    m = np.array(mean, dtype=np.float32)
    s = np.array(std, dtype=np.float32)
    img = ((img.T - m) / s).T
    patches = np.expand_dims(img, axis=0)
    patches = np.expand_dims(patches, axis=1)
    patches = np.concatenate([patches, np.repeat(patches[:, -1:], T - 1, axis=1)], axis=1)
    b, gt, c = patches.shape[0], patches.shape[1] // T, patches.shape[2]
    gh, gw = resized_rgb.shape[0] // P, resized_rgb.shape[1] // P
    patches = patches.reshape(b, gt, T, c, gh // M, M, P, gw // M, M, P)
    patches = patches.transpose(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    flat = patches.reshape(b * gt * gh * gw, c * T * P * P)
    return np.ascontiguousarray(flat, dtype=np.float32), (gt, gh, gw)


def photo(w, h, seed):
    """Gradients, a few soft shapes and noise: texture at every scale, like a photo."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 128 + 100 * np.sin(x / (w / 3.1 + 1)) * np.cos(y / (h / 2.3 + 1))
    g = 255 * x / max(w - 1, 1)
    b = 255 * y / max(h - 1, 1)
    cx, cy = w * 0.6, h * 0.4
    d = np.sqrt((x - cx) ** 2 + (y - cy) ** 2)
    r = np.where(d < min(w, h) / 4, 240 - d, r)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 18, (h, w, 3))
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def save(im, path, fmt, **kw):
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def png_chunk(t, data):
    return struct.pack(">I", len(data)) + t + data + struct.pack(">I", zlib.crc32(t + data) & 0xFFFFFFFF)


def write_adam7_png(path, rgb: np.ndarray):
    """An interlaced RGB PNG (PIL cannot write one): 7 Adam7 passes, filter 0 on every row."""
    h, w, _ = rgb.shape
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    raw = b""
    for x0, y0, dx, dy in passes:
        sub = rgb[y0::dy, x0::dx]
        if sub.size == 0:
            continue
        for row in sub:
            raw += b"\0" + row.tobytes()
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 1)
    data = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(data)


def write_bmp16(path, rgb: np.ndarray, layout):
    """16-bit BITFIELDS BMP (565 or 555), bottom-up."""
    h, w, _ = rgb.shape
    r, g, b = [rgb[..., i].astype(np.uint32) for i in range(3)]
    if layout == 565:
        v = (r >> 3) << 11 | (g >> 2) << 5 | (b >> 3)
        masks = (0xF800, 0x07E0, 0x001F)
    else:
        v = (r >> 3) << 10 | (g >> 3) << 5 | (b >> 3)
        masks = (0x7C00, 0x03E0, 0x001F)
    stride = (w * 16 + 31) // 32 * 4
    rows = b""
    for y in range(h - 1, -1, -1):
        row = v[y].astype("<u2").tobytes()
        rows += row + b"\0" * (stride - len(row))
    off = 14 + 40 + 12
    hdr = b"BM" + struct.pack("<IHHI", off + len(rows), 0, 0, off)
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 16, 3, len(rows), 2835, 2835, 0, 0) + struct.pack("<III", *masks)
    with open(path, "wb") as f:
        f.write(hdr + info + rows)


def bmp_top_down(src_path, dst_path):
    """Rewrites a bottom-up BMP as top-down (negative height, rows reversed)."""
    d = bytearray(open(src_path, "rb").read())
    off = struct.unpack_from("<I", d, 10)[0]
    w, h = struct.unpack_from("<ii", d, 18)
    bpp = struct.unpack_from("<H", d, 28)[0]
    stride = (w * bpp + 31) // 32 * 4
    rows = [bytes(d[off + i * stride: off + (i + 1) * stride]) for i in range(h)]
    d[off: off + h * stride] = b"".join(reversed(rows))
    struct.pack_into("<i", d, 22, -h)
    open(dst_path, "wb").write(bytes(d))


def gif_offset_frame(src_path, dst_path, screen_w, screen_h, left, top):
    """Puts the first (only) frame of a PIL-written GIF at (left, top) on a larger logical screen."""
    d = bytearray(open(src_path, "rb").read())
    struct.pack_into("<HH", d, 6, screen_w, screen_h)
    i = 13
    if d[10] & 0x80:
        i += 3 * (2 << (d[10] & 7))
    while d[i] == 0x21:  # skip extensions
        i += 2
        while d[i]:
            i += d[i] + 1
        i += 1
    assert d[i] == 0x2C
    struct.pack_into("<HH", d, i + 1, left, top)
    open(dst_path, "wb").write(bytes(d))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "images"))
    args = ap.parse_args()
    out = os.path.normpath(args.out)
    os.makedirs(out, exist_ok=True)
    files = []  # (name, note)

    def add(name, note=""):
        files.append((name, note))
        return os.path.join(out, name)

    base = photo(97, 61, 1)
    im = Image.fromarray(base)
    save(im, add("photo_97x61.png", "RGB 8-bit"), "PNG")
    for q in (95, 75, 30):
        save(im, add("photo_97x61_q%d.jpg" % q, "baseline 4:2:0"), "JPEG", quality=q)
    save(im, add("photo_97x61_444.jpg", "4:4:4"), "JPEG", quality=90, subsampling=0)
    save(im, add("photo_97x61_422.jpg", "4:2:2"), "JPEG", quality=90, subsampling=1)
    save(im, add("photo_97x61_prog.jpg", "progressive"), "JPEG", quality=85, progressive=True)
    save(im.convert("L"), add("photo_97x61_gray.jpg", "grayscale"), "JPEG", quality=85)
    save(im.convert("CMYK"), add("photo_97x61_cmyk.jpg", "CMYK, Adobe inverted"), "JPEG", quality=90)
    big = Image.fromarray(photo(333, 177, 2))
    save(big, add("photo_333x177.png", "odd size"), "PNG")
    save(big, add("photo_333x177_q85.jpg", "odd size"), "JPEG", quality=85)
    save(Image.fromarray(photo(1, 1, 3)), add("pixel_1x1.png", "1x1"), "PNG")
    save(Image.fromarray(photo(7, 5, 4)), add("tiny_7x5.png", "upscaled by smart_resize"), "PNG")
    save(Image.fromarray(photo(600, 4, 5)), add("wide_600x4.png", "aspect 150"), "PNG")
    save(Image.fromarray(photo(5, 700, 6)), add("tall_5x700.png", "aspect 140"), "PNG")
    save(Image.fromarray(photo(402, 2, 7)), add("wide_402x2.png", "aspect 201: smart_resize refuses"), "PNG")
    save(Image.fromarray(photo(640, 480, 8)), add("photo_640x480_q90.jpg", "downscaled with the small config"), "JPEG", quality=90)
    # alpha and other PNG layouts
    rgba = np.dstack([base, (np.arange(97)[None, :] * 255 // 96 * np.ones((61, 1))).astype(np.uint8)])
    save(Image.fromarray(rgba, "RGBA"), add("rgba_97x61.png", "RGBA, alpha dropped"), "PNG")
    save(Image.fromarray(rgba[..., [0, 3]].copy(), "LA"), add("la_97x61.png", "gray+alpha"), "PNG")
    pim = im.quantize(colors=37)
    save(pim, add("palette_97x61.png", "palette 37 colours"), "PNG")
    save(pim, add("palette_trns_97x61.png", "palette + tRNS"), "PNG", transparency=5)
    save(Image.fromarray(base).convert("L"), add("gray_97x61.png", "gray 8-bit"), "PNG")
    save(Image.fromarray(base).convert("1"), add("bilevel_97x61.png", "1-bit"), "PNG")
    g16 = (base[..., 0].astype(np.uint16) * 3).astype(np.uint16)  # values up to 765: PIL clips to 255
    save(Image.fromarray(g16.astype(np.int32), "I").convert("I;16"), add("gray16_97x61.png", "16-bit gray"), "PNG")
    for bits in (2, 4):
        save(Image.fromarray(base).convert("L"), add("gray%d_97x61.png" % bits, "%d-bit gray" % bits), "PNG", bits=bits)
    write_adam7_png(add("interlaced_97x61.png", "Adam7"), base)
    rgb16 = base.astype(">u2") * 257 + 3
    png16 = (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", 97, 61, 16, 2, 0, 0, 0)) +
             png_chunk(b"IDAT", zlib.compress(b"".join(b"\0" + r.tobytes() for r in rgb16), 9)) + png_chunk(b"IEND", b""))
    open(add("rgb16_97x61.png", "16-bit RGB"), "wb").write(png16)
    # GIF
    save(pim, add("palette_97x61.gif", "palette, interlaced by PIL"), "GIF")
    save(pim, add("palette_97x61_noint.gif", "not interlaced"), "GIF", interlace=False)
    save(pim, add("palette_trns_97x61.gif", "transparency index 5"), "GIF", transparency=5)
    save(Image.fromarray(base).convert("L"), add("gray_97x61.gif", "grayscale palette"), "GIF")
    small = Image.fromarray(photo(20, 12, 9)).quantize(colors=16)
    save(small, os.path.join(out, "_tmp.gif"), "GIF", interlace=False)
    gif_offset_frame(os.path.join(out, "_tmp.gif"), add("offset_frame.gif", "frame at (3,2) on 30x20"), 30, 20, 3, 2)
    save(small, os.path.join(out, "_tmp.gif"), "GIF", interlace=False, transparency=2)
    gif_offset_frame(os.path.join(out, "_tmp.gif"), add("offset_frame_trns.gif", "offset + transparency"), 30, 20, 3, 2)
    gif_offset_frame(os.path.join(out, "_tmp.gif"), add("frame_past_screen.gif", "frame larger than screen"), 15, 8, 4, 3)
    os.remove(os.path.join(out, "_tmp.gif"))
    # BMP
    save(im, add("photo_97x61_24.bmp", "24-bit"), "BMP")
    save(pim, add("palette_97x61_8.bmp", "8-bit palette"), "BMP")
    save(Image.fromarray(base).convert("1"), add("bilevel_97x61_1.bmp", "1-bit"), "BMP")
    save(Image.fromarray(rgba, "RGBA"), add("rgba_97x61_32.bmp", "32-bit"), "BMP")
    bmp_top_down(os.path.join(out, "photo_97x61_24.bmp"), add("photo_97x61_24_topdown.bmp", "negative height"))
    write_bmp16(add("photo_97x61_565.bmp", "16-bit 565"), base, 565)
    write_bmp16(add("photo_97x61_555.bmp", "16-bit 555"), base, 555)
    # WebP
    save(im, add("photo_97x61_q80.webp", "lossy"), "WEBP", quality=80)
    save(im, add("photo_97x61_lossless.webp", "lossless"), "WEBP", lossless=True)
    save(Image.fromarray(rgba, "RGBA"), add("rgba_97x61_q80.webp", "lossy + alpha"), "WEBP", quality=80)
    save(Image.fromarray(rgba, "RGBA"), add("rgba_97x61_lossless.webp", "lossless + alpha"), "WEBP", lossless=True, exact=True)
    # EXIF orientation (load_image applies ImageOps.exif_transpose)
    ex_src = Image.fromarray(photo(40, 24, 10))
    for o in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = o
        save(ex_src, add("exif_orient%d.jpg" % o, "EXIF orientation %d" % o), "JPEG", quality=90, exif=exif.tobytes())

    for o, fmt, ext, kw in ((6, "PNG", "png", {}), (3, "PNG", "png", {}), (8, "WEBP", "webp", {"lossless": True}),
                            (5, "WEBP", "webp", {"quality": 90})):
        exif = Image.Exif()
        exif[0x0112] = o
        save(ex_src, add("exif_orient%d.%s" % (o, ext), "EXIF orientation %d in %s" % (o, fmt)), fmt, exif=exif.tobytes(), **kw)
    # Palette indices past the end of the file's palette read PIL's default gray ramp (i, i, i).
    oob = Image.new("P", (4, 2))
    oob.putpalette([10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120])
    oob.putdata([0, 1, 2, 3, 4, 5, 6, 7])
    save(oob, add("palette_oob.gif", "4-entry palette, indices to 7"), "GIF")
    save(oob, add("palette_oob.bmp", "4-entry palette, indices to 7"), "BMP")
    raw = b"".join(b"\0" + bytes(range(y * 4, y * 4 + 4)) for y in range(2))
    png = (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 2, 8, 3, 0, 0, 0)) +
           png_chunk(b"PLTE", bytes([10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120])) +
           png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b""))
    open(add("palette_oob.png", "4-entry PLTE, indices to 7"), "wb").write(png)
    d = bytearray(open(os.path.join(out, "palette_oob.gif"), "rb").read())
    n = 3 * (2 << (d[10] & 7))
    d2 = d[:13] + d[13 + n:]
    d2[10] &= 0x7F
    open(add("no_palette.gif", "no colour table: PIL mode L"), "wb").write(bytes(d2))

    configs = {
        "default": dict(min_pixels=65536, max_pixels=16777216),
        "small": dict(min_pixels=4096, max_pixels=50176),
    }
    entries = []
    for name, note in files:
        path = os.path.join(out, name)
        with Image.open(path) as src:
            src_mode = src.mode
            img = ImageOps.exif_transpose(src).convert("RGB")
        arr = np.asarray(img, dtype=np.uint8)
        e = {"file": name, "note": note, "pil_mode": src_mode, "width": img.width, "height": img.height,
             "rgb": csum(arr.tobytes())}
        for cname, cfg in configs.items():
            sz = smart_resize(img.height, img.width, 32, cfg["min_pixels"], cfg["max_pixels"])
            if sz is None:
                e[cname] = {"error": "aspect"}
                continue
            rh, rw = sz
            rs = np.asarray(img.resize((rw, rh), Image.BICUBIC), dtype=np.uint8)
            pv, grid = pixel_values(rs)
            e[cname] = {"resized_h": rh, "resized_w": rw, "resized": csum(rs.tobytes()), "grid": list(grid),
                        "pixel_values": csum(pv.tobytes()), "pv_sum": float(pv.astype(np.float64).sum()),
                        "pv_first": [float(v) for v in pv[0, :4]]}
        entries.append(e)

    # Resampling alone, on one source, for sizes the processor would not choose.
    src = Image.open(os.path.join(out, "photo_333x177.png")).convert("RGB")
    resize_cases = []
    for w, h in [(333, 177), (333, 100), (100, 177), (999, 531), (45, 11), (1, 1), (7, 300), (512, 64), (334, 178), (48, 24)]:
        rs = np.asarray(src.resize((w, h), Image.BICUBIC), dtype=np.uint8)
        resize_cases.append({"width": w, "height": h, "resized": csum(rs.tobytes())})

    table = []
    for h, w, mn, mx in [(48, 80, 1, 1 << 30), (80, 48, 1, 1 << 30), (112, 144, 1, 1 << 30), (16, 16, 1, 1 << 30),
                         (47, 81, 1, 1 << 30), (49, 79, 1, 1 << 30), (1000, 1000, 65536, 16777216),
                         (7, 5, 65536, 16777216), (1, 200, 65536, 16777216), (1, 201, 65536, 16777216),
                         (4000, 3000, 65536, 16777216), (10000, 10000, 65536, 16777216), (12, 2400, 65536, 16777216),
                         (640, 480, 4096, 50176), (50000, 300, 4096, 50176), (300, 50000, 4096, 50176),
                         (224, 224, 4096, 50176), (225, 223, 4096, 50176), (3, 600, 4096, 50176), (17, 17, 1024, 1024)]:
        r = smart_resize(h, w, 32, mn, mx)
        table.append({"h": h, "w": w, "min": mn, "max": mx, "out": list(r) if r else None})

    meta = {"generator": "tools/oracle/image_goldens.py", "pillow": Image.__version__, "numpy": np.__version__,
            "libjpeg": features.version("jpg"), "libwebp": features.version("webp"), "zlib": features.version("zlib"),
            "configs": configs, "images": entries, "resize": {"source": "photo_333x177.png", "cases": resize_cases},
            "smart_resize": table}
    with open(os.path.join(out, "goldens.json"), "w") as f:
        json.dump(meta, f, indent=1)
    total = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
    print("wrote %d images, goldens.json; %d bytes in %s" % (len(files), total, out))


if __name__ == "__main__":
    main()
