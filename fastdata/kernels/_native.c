/* fastdata's image kernels, on packed uint8 RGB and float32 planes; vector extensions of GCC or
 * Clang, with AVX-512 and AVX2 + FMA clones chosen at load time on x86-64. Where this file does
 * not build, fastdata runs torch ops instead.
 *
 * - crop_resize: crop -> antialiased bilinear resize -> flip -> normalise, uint8 HWC in,
 *   float32, bfloat16 or uint8 out (rounded once, at the store). The same weights as torch's interpolate(mode="bilinear", antialias=True,
 *   align_corners=False) (PIL's triangle filter, widened by the downscale factor) and as
 *   fastdata.ops.crop's batched path, in float32 with no uint8 rounding in between. Per output
 *   row the source rows it needs are combined (vertical pass, contiguous, vectorised), then
 *   each output pixel is a few 4-lane multiply-adds over that row (planar output: 4 pixels'
 *   results transposed into one vector per plane); the output is written once.
 * - color_jitter: torchvision's brightness, contrast, saturation and hue on float images in
 *   [0, 1], in place, with an optional per-channel scale and shift in the same pass (the
 *   loader's normalisation).
 * - pack_rgb: the converter's 4-byte Pillow pixels to packed RGB.
 * - fill_outlines: instance masks drawn from their outlines (polygons), a pixel inside where
 *   its centre is (even-odd within an outline, the union of a mask's outlines).
 * - sample_runs: class maps read straight from their runs (lengths and values) at the pixels a
 *   crop samples, flipped where asked, without decoding a map whole.
 *
 * Called from fastdata/kernels/cpu.py (and converters/decode.py for pack_rgb), which check
 * every pointer, shape and box before they call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float v4 __attribute__((vector_size(16)));
typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef int32_t v4i __attribute__((vector_size(16)));

/* lanes picked from one vector or two (indices 0.. of a, then of b), as constants: GCC's and
 * Clang's spellings */
#if defined(__clang__)
#define SHUFFLE1(T, a, ...) __builtin_shufflevector(a, a, __VA_ARGS__)
#define SHUFFLE2(T, a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUFFLE1(T, a, ...) __builtin_shuffle(a, (T){__VA_ARGS__})
#define SHUFFLE2(T, a, b, ...) __builtin_shuffle(a, b, (T){__VA_ARGS__})
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__)
/* AVX-512 (x86-64-v4: twice the vector registers; docs/performance.md) or AVX2 + FMA (8-wide
 * vertical pass) where the CPU has them, chosen when the module loads (an ifunc: GCC with
 * glibc); elsewhere the compiler's baseline (SSE2 on x86-64) */
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

static inline v4 load4(const float *p) { v4 v; memcpy(&v, p, sizeof v); return v; }
/* a macro, not a function: a function returning an 8-lane vector is compiled for the baseline
 * target too, where its calling convention differs (a compiler warning) */
#define load8(p) ({ v8 v8_; memcpy(&v8_, (p), sizeof v8_); v8_; })
/* 4 floats from p0 and 4 from p1 as one 8-lane vector; its halves back as 4-lane ones */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define LOAD2(p0, p1) __builtin_shufflevector(load4(p0), load4(p1), 0, 1, 2, 3, 4, 5, 6, 7)
#define LOW4(v) __builtin_shufflevector(v, v, 0, 1, 2, 3)
#define HIGH4(v) __builtin_shufflevector(v, v, 4, 5, 6, 7)
#else
#define LOAD2(p0, p1) ({ v8 v2_; memcpy(&v2_, (p0), 16); memcpy((char *)&v2_ + 16, (p1), 16); \
                         v2_; })
#define LOW4(v) ({ v4 l_; memcpy(&l_, &(v), 16); l_; })
#define HIGH4(v) ({ v4 h_; memcpy(&h_, (char *)&(v) + 16, 16); h_; })
#endif
static inline int ifloor(double v) { int i = (int)v; return i - (i > v); }
static inline int iceil(double v) { int i = (int)v; return i + (i < v); }

/* Output pixel i of a window of len pixels resized to out (mirrored if flip) reads count[i]
 * pixels from first[i], weighted by w[i*K ..] (zeros after them, up to K). Returns the largest
 * count. */
static int taps(int len, int out, int flip, int *first, int *count, float *w, int K) {
    double scale = (double)len / out, support = scale > 1 ? scale : 1;
    int most = 1;
    for (int i = 0; i < out; i++) {
        double c = ((flip ? out - 1 - i : i) + 0.5) * scale - 0.5;
        int lo = ifloor(c - support) + 1, hi = iceil(c + support) - 1;
        if (lo < 0) lo = 0;
        if (hi > len - 1) hi = len - 1;
        int n = hi - lo + 1;
        float *wi = w + (size_t)i * K, sum = 0;
        for (int k = 0; k < n; k++) {
            double d = lo + k - c;
            float v = (float)(1 - (d < 0 ? -d : d) / support);
            wi[k] = v > 0 ? v : 0;
            sum += wi[k];
        }
        for (int k = 0; k < n; k++) wi[k] /= sum;
        for (int k = n; k < K; k++) wi[k] = 0;
        first[i] = lo;
        count[i] = n;
        if (n > most) most = n;
    }
    return most;
}

/* The output's element types: float32 (stored as computed); bfloat16 (rounded to nearest
 * even, as torch rounds) and uint8 (rounded, clamped to 0..255), converted a row at a time
 * from float32 in loops the compiler vectorises. */
enum { OUT_F32 = 0, OUT_BF16 = 1, OUT_U8 = 2 };

/* Each of n floats converted, stored step elements apart; 8 at a time where contiguous and
 * the compiler can pick bytes out of a vector (GCC 12, Clang). bfloat16: the upper half of
 * each float's bits once rounded; uint8: the low byte of f + 1.5 * 2^23, whose addition
 * rounds f to the nearest integer (even at a tie, as torch rounds). uint8's values need no
 * clamp: the resize's weights are >= 0 and sum to 1 over uint8 pixels (the uint8 output has
 * no normalisation). */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define PICK_BYTES 1
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef uint8_t v32u8 __attribute__((vector_size(32)));
typedef uint8_t v16u8 __attribute__((vector_size(16)));
typedef uint8_t v8u8 __attribute__((vector_size(8)));
#endif

static inline uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

static inline uint8_t u8_of(float f) {
    f += 12582912.0f;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint8_t)u;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
/* The CPU's own conversion where it has one (AVX512-BF16: round to nearest even, as torch
 * rounds every finite value; these outputs are never NaN): one instruction for 8 floats. */
#include <immintrin.h>
#define BF16_INSN 1
__attribute__((target("avx512bf16,avx512vl,avx512f,avx2")))
static void to_bf16_insn(const float *f, uint16_t *d, int n) {
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m128bh h = _mm256_cvtneps_pbh(_mm256_loadu_ps(f + j));
        _mm_storeu_si128((__m128i *)(d + j), (__m128i)h);
    }
    for (; j < n; j++) d[j] = bf16_of(f[j]);
}
static int has_bf16_insn(void) {
    static int known = -1;      /* set once; a race sets the same value */
    if (known < 0) known = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports(
                               "avx512vl");
    return known;
}
#endif

CLONES static void to_bf16(const float *f, uint16_t *d, int64_t step, int n) {
    int j = 0;
#ifdef BF16_INSN
    if (step == 1 && has_bf16_insn()) {
        to_bf16_insn(f, d, n);
        return;
    }
#endif
#ifdef PICK_BYTES
    if (step == 1)
        for (; j + 8 <= n; j += 8) {
            v8u u;
            memcpy(&u, f + j, sizeof u);
            u += 0x7FFF + ((u >> 16) & 1);
            v32u8 b;
            memcpy(&b, &u, sizeof b);
            v16u8 h = __builtin_shufflevector(b, b, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23,
                                              26, 27, 30, 31);
            memcpy(d + j, &h, sizeof h);
        }
#endif
    for (; j < n; j++) d[j * step] = bf16_of(f[j]);
}

CLONES static void to_u8(const float *f, uint8_t *d, int64_t step, int n) {
    int j = 0;
#ifdef PICK_BYTES
    if (step == 1)
        for (; j + 8 <= n; j += 8) {
            v8 t = load8(f + j) + 12582912.0f;
            v32u8 b;
            memcpy(&b, &t, sizeof b);
            v8u8 r = __builtin_shufflevector(b, b, 0, 4, 8, 12, 16, 20, 24, 28);
            memcpy(d + j, &r, sizeof r);
        }
#endif
    for (; j < n; j++) d[j * step] = u8_of(f[j]);
}

static void convert(const float *f, void *d, int T, int64_t step, int n) {
    if (T == OUT_BF16) to_bf16(f, d, step, n);
    else to_u8(f, d, step, n);
}

/* One output row from the combined source row; K taps (a constant where inlined). */
static inline __attribute__((always_inline)) void hpass(
        int out, int K, const float *w, int stride, const int *first, const float *row,
        float *d, int64_t oc, int64_t ox, v4 a, v4 b) {
    for (int x = 0; x < out; x++) {
        const float *wx = w + (size_t)x * stride, *r = row + first[x] * 3;
        v4 acc = wx[0] * load4(r);
        for (int k = 1; k < K; k++) acc += wx[k] * load4(r + 3 * k);
        acc = acc * a + b;
        float *p = d + x * ox;
        if (oc == 1 && ox == 3 && x < out - 1)
            memcpy(p, &acc, sizeof acc);        /* the next pixel overwrites lane 4 */
        else { p[0] = acc[0]; p[oc] = acc[1]; p[2 * oc] = acc[2]; }
    }
}

/* Two output rows at once from their combined source rows row0 and row1: the same columns
 * and weights, so each tap's index and weight are loaded once for both (the rows in the two
 * halves of an 8-lane vector). */
static inline __attribute__((always_inline)) void hpass2(
        int out, int K, const float *w, int stride, const int *first, const float *row0,
        const float *row1, float *d0, float *d1, int64_t oc, int64_t ox, v8 a, v8 b) {
    for (int x = 0; x < out; x++) {
        const float *wx = w + (size_t)x * stride;
        int f = first[x] * 3;
        v8 acc = wx[0] * LOAD2(row0 + f, row1 + f);
        for (int k = 1; k < K; k++)
            acc += wx[k] * LOAD2(row0 + f + 3 * k, row1 + f + 3 * k);
        acc = acc * a + b;
        float *p0 = d0 + x * ox, *p1 = d1 + x * ox;
        if (oc == 1 && ox == 3 && x < out - 1) {     /* the next pixel overwrites lane 4 */
            v4 lo = LOW4(acc), hi = HIGH4(acc);
            memcpy(p0, &lo, 16);
            memcpy(p1, &hi, 16);
        } else {
            p0[0] = acc[0]; p0[oc] = acc[1]; p0[2 * oc] = acc[2];
            p1[0] = acc[4]; p1[oc] = acc[5]; p1[2 * oc] = acc[6];
        }
    }
}

/* Planar output (ox == 1): 4 output pixels at a time, their [r g b .] results transposed into
 * 4 reds, 4 greens and 4 blues, one 4-float store per plane (not 3 lane extracts and scalar
 * stores a pixel); the last out % 4 pixels as hpass does. */
static inline __attribute__((always_inline)) void hpass_planar(
        int out, int K, const float *w, int stride, const int *first, const float *row,
        float *d, int64_t oc, v4 a, v4 b) {
    int x = 0;
    for (; x + 4 <= out; x += 4) {
        v4 acc[4];
        for (int q = 0; q < 4; q++) {
            const float *wx = w + (size_t)(x + q) * stride, *r = row + first[x + q] * 3;
            v4 s = wx[0] * load4(r);
            for (int k = 1; k < K; k++) s += wx[k] * load4(r + 3 * k);
            acc[q] = s * a + b;
        }
        /* (r0 r1 g0 g1), (b0 b1 . .) from pixels 0 and 1; the same from 2 and 3 */
        v4 t0 = SHUFFLE2(v4i, acc[0], acc[1], 0, 4, 1, 5);
        v4 t1 = SHUFFLE2(v4i, acc[2], acc[3], 0, 4, 1, 5);
        v4 u0 = SHUFFLE2(v4i, acc[0], acc[1], 2, 6, 3, 7);
        v4 u1 = SHUFFLE2(v4i, acc[2], acc[3], 2, 6, 3, 7);
        v4 P[3] = {SHUFFLE2(v4i, t0, t1, 0, 1, 4, 5), SHUFFLE2(v4i, t0, t1, 2, 3, 6, 7),
                   SHUFFLE2(v4i, u0, u1, 0, 1, 4, 5)};
        for (int c = 0; c < 3; c++) memcpy(d + c * oc + x, &P[c], 16);
    }
    if (x < out)
        hpass(out - x, K, w + (size_t)x * stride, stride, first + x, row, d + x, oc, 1, a, b);
}

/* hpass_planar for two rows (hpass2's 8-lane vectors): the same transposition in each half */
static inline __attribute__((always_inline)) void hpass2_planar(
        int out, int K, const float *w, int stride, const int *first, const float *row0,
        const float *row1, float *d0, float *d1, int64_t oc, v8 a, v8 b) {
    int x = 0;
    for (; x + 4 <= out; x += 4) {
        v8 acc[4];
        for (int q = 0; q < 4; q++) {
            const float *wx = w + (size_t)(x + q) * stride;
            int f = first[x + q] * 3;
            v8 s = wx[0] * LOAD2(row0 + f, row1 + f);
            for (int k = 1; k < K; k++)
                s += wx[k] * LOAD2(row0 + f + 3 * k, row1 + f + 3 * k);
            acc[q] = s * a + b;
        }
        v8 t0 = SHUFFLE2(v8i, acc[0], acc[1], 0, 8, 1, 9, 4, 12, 5, 13);
        v8 t1 = SHUFFLE2(v8i, acc[2], acc[3], 0, 8, 1, 9, 4, 12, 5, 13);
        v8 u0 = SHUFFLE2(v8i, acc[0], acc[1], 2, 10, 3, 11, 6, 14, 7, 15);
        v8 u1 = SHUFFLE2(v8i, acc[2], acc[3], 2, 10, 3, 11, 6, 14, 7, 15);
        v8 P[3] = {SHUFFLE2(v8i, t0, t1, 0, 1, 8, 9, 4, 5, 12, 13),
                   SHUFFLE2(v8i, t0, t1, 2, 3, 10, 11, 6, 7, 14, 15),
                   SHUFFLE2(v8i, u0, u1, 0, 1, 8, 9, 4, 5, 12, 13)};
        for (int c = 0; c < 3; c++) {
            v4 lo = LOW4(P[c]), hi = HIGH4(P[c]);
            memcpy(d0 + c * oc + x, &lo, 16);
            memcpy(d1 + c * oc + x, &hi, 16);
        }
    }
    if (x < out)
        hpass2(out - x, K, w + (size_t)x * stride, stride, first + x, row0, row1, d0 + x,
               d1 + x, oc, 1, a, b);
}

/* f(out, K, ...) with the taps' count K a constant for 1 to 4 (the common counts: the inner
 * loop unrolled), the variable kx beyond */
#define BY_TAPS(f, ...) switch (kx) { \
    case 1: f(out, 1, __VA_ARGS__); break; \
    case 2: f(out, 2, __VA_ARGS__); break; \
    case 3: f(out, 3, __VA_ARGS__); break; \
    case 4: f(out, 4, __VA_ARGS__); break; \
    default: f(out, kx, __VA_ARGS__); }
#define HPASS(OC, OX) BY_TAPS(hpass, wx, Kx, fx, row, d, OC, OX, a, b)
#define HPASS2(OC, OX) BY_TAPS(hpass2, wx, Kx, fx, row, row2, d, d2, OC, OX, a8, b8)
#define HPASS_PLANAR(OC) BY_TAPS(hpass_planar, wx, Kx, fx, row, d, OC, a, b)
#define HPASS2_PLANAR(OC) BY_TAPS(hpass2_planar, wx, Kx, fx, row, row2, d, d2, OC, a8, b8)

/* One image's resampling plan: the taps and weights of each output column and row, and the
 * row buffers (the vertical pass's, and a converted output's float32 rows; two of each for a
 * converted output, which makes two output rows a pass). */
typedef struct {
    int Kx, Ky, kx, *fx, *fy, *cy;
    float *wx, *wy, *row, *row2, *orow, *orow2;
} Plan;

static void plan_free(Plan *p) { free(p->fx); free(p->wx); free(p->row); free(p->orow); }

static int plan_init(Plan *p, int h, int w, int flip, int out, int convert) {
    p->Kx = 2 * (w > out ? (w + out - 1) / out : 1) + 2;
    p->Ky = 2 * (h > out ? (h + out - 1) / out : 1) + 2;
    p->fx = malloc(sizeof(int) * 3 * (size_t)out);
    p->wx = malloc(sizeof(float) * (size_t)out * (p->Kx + p->Ky));
    size_t n = (size_t)3 * (w + p->Kx) + 4;     /* zeros past each row */
    /* a converted output makes two output rows a pass: two rows of each */
    p->row = calloc(convert ? 2 * n : n, sizeof(float));
    p->orow = convert ? malloc(sizeof(float) * 2 * (3 * (size_t)out + 1)) : NULL;
    if (!p->fx || !p->wx || !p->row || (convert && !p->orow)) { plan_free(p); return -1; }
    p->row2 = convert ? p->row + n : NULL;
    p->orow2 = convert ? p->orow + 3 * (size_t)out + 1 : NULL;
    p->fy = p->fx + out;
    p->cy = p->fy + out;
    p->wy = p->wx + (size_t)out * p->Kx;
    p->kx = taps(w, out, flip, p->fx, p->cy, p->wx, p->Kx);     /* cy: scratch here */
    taps(h, out, 0, p->fy, p->cy, p->wy, p->Ky);
    return 0;
}

/* The source rows that output row y reads, combined into row. */
static inline __attribute__((always_inline)) void vpass(const Plan *p, const uint8_t *src,
                                                        int64_t rs, int n3, int y, float *row) {
    const float *wk = p->wy + (size_t)y * p->Ky;
    const uint8_t *s = src + p->fy[y] * rs;
    for (int j = 0; j < n3; j++) row[j] = wk[0] * s[j];
    for (int k = 1; k < p->cy[y]; k++) {
        const uint8_t *sk = s + k * rs;
        float wv = wk[k];
        for (int j = 0; j < n3; j++) row[j] += wv * sk[j];
    }
}

/* float32 output: each row written in place. src: the crop's top-left pixel of an HWC uint8
 * image whose rows are rs bytes apart. Planar (ox == 1, a constant where inlined) gets a
 * function of its own below, as the converted outputs do: compiled into one function with the
 * planar loop, the packed loop ran slower. */
static inline __attribute__((always_inline)) void rows_f32(
        const Plan *p, const uint8_t *src, int64_t rs, int w, int out, float *dst, int64_t oc,
        int64_t oy, int64_t ox, v4 a, v4 b, int planar) {
    int kx = p->kx, Kx = p->Kx;
    const int *fx = p->fx;
    const float *wx = p->wx, *row = p->row;
    for (int y = 0; y < out; y++) {
        vpass(p, src, rs, 3 * w, y, p->row);
        float *d = dst + y * oy;
        if (planar) { HPASS_PLANAR(oc) }
        else if (oc == 1 && ox == 3) { HPASS(1, 3) }
        else { HPASS(oc, ox) }
    }
}

CLONES static void rows_f32_strided(const Plan *p, const uint8_t *src, int64_t rs, int w,
                                    int out, float *dst, int64_t oc, int64_t oy, int64_t ox,
                                    v4 a, v4 b) {
    rows_f32(p, src, rs, w, out, dst, oc, oy, ox, a, b, 0);
}

CLONES static void rows_f32_planar(const Plan *p, const uint8_t *src, int64_t rs, int w,
                                   int out, float *dst, int64_t oc, int64_t oy, v4 a, v4 b) {
    rows_f32(p, src, rs, w, out, dst, oc, oy, 1, a, b, 1);
}

/* bfloat16 or uint8 output (T): each row made in float32, then converted into place; two rows
 * a pass (HPASS2), which the float32 output's direct writes into two rows of the batch do not
 * gain from. Packed (channels_last), or made as planes and converted with the output's strides
 * (any other layout); which, a constant where inlined: each gets a function of its own below
 * (see rows_f32). */
static inline __attribute__((always_inline)) void rows_converted(
        const Plan *p, const uint8_t *src, int64_t rs, int w, int out, void *dst, int T,
        int64_t oc, int64_t oy, int64_t ox, v4 a, v4 b, int planar) {
    int kx = p->kx, Kx = p->Kx;
    const int *fx = p->fx;
    const float *wx = p->wx, *row = p->row, *row2 = p->row2;
    float *d = p->orow, *d2 = p->orow2;
    v8 a8 = {a[0], a[1], a[2], a[3], a[0], a[1], a[2], a[3]};
    v8 b8 = {b[0], b[1], b[2], b[3], b[0], b[1], b[2], b[3]};
    size_t esize = T == OUT_BF16 ? 2 : 1;
    for (int y = 0; y < out; y += 2) {
        int two = y + 1 < out;
        vpass(p, src, rs, 3 * w, y, p->row);
        if (two) vpass(p, src, rs, 3 * w, y + 1, p->row2);
        char *o = (char *)dst + (size_t)y * oy * esize;
        if (!planar) {                      /* packed: converted as one run */
            if (two) { HPASS2(1, 3) } else { HPASS(1, 3) }
            convert(d, o, T, 1, 3 * out);
            if (two) convert(d2, o + oy * esize, T, 1, 3 * out);
        } else {                            /* planar, each plane converted */
            if (two) { HPASS2_PLANAR(out) } else { HPASS_PLANAR(out) }
            for (int c = 0; c < 3; c++) convert(d + c * out, o + c * oc * esize, T, ox, out);
            if (two)
                for (int c = 0; c < 3; c++)
                    convert(d2 + c * out, o + (oy + c * oc) * esize, T, ox, out);
        }
    }
}

CLONES static void rows_converted_packed(const Plan *p, const uint8_t *src, int64_t rs, int w,
                                         int out, void *dst, int T, int64_t oy, v4 a, v4 b) {
    rows_converted(p, src, rs, w, out, dst, T, 1, oy, 3, a, b, 0);
}

CLONES static void rows_converted_planar(const Plan *p, const uint8_t *src, int64_t rs, int w,
                                         int out, void *dst, int T, int64_t oc, int64_t oy,
                                         int64_t ox, v4 a, v4 b) {
    rows_converted(p, src, rs, w, out, dst, T, oc, oy, ox, a, b, 1);
}

static int crop_resize_one(const uint8_t *src, int64_t rs, int h, int w, int flip, int out,
                           void *dst, int T, int64_t oc, int64_t oy, int64_t ox, v4 a, v4 b) {
    Plan p;
    if (out < 1) return 0;
    if (plan_init(&p, h, w, flip, out, T != OUT_F32)) return -1;
    if (T == OUT_F32 && ox == 1) rows_f32_planar(&p, src, rs, w, out, dst, oc, oy, a, b);
    else if (T == OUT_F32) rows_f32_strided(&p, src, rs, w, out, dst, oc, oy, ox, a, b);
    else if (oc == 1 && ox == 3) rows_converted_packed(&p, src, rs, w, out, dst, T, oy, a, b);
    else rows_converted_planar(&p, src, rs, w, out, dst, T, oc, oy, ox, a, b);
    plan_free(&p);
    return 0;
}

static PyObject *crop_resize(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    unsigned long long src, rows, params, dst, scale, shift;
    int out, T;
    long long on, oc, oy, ox;
    if (!PyArg_ParseTuple(args, "nKKKiKiLLLLKK", &n, &src, &rows, &params, &out, &dst, &T,
                          &on, &oc, &oy, &ox, &scale, &shift))
        return NULL;
    if (T < OUT_F32 || T > OUT_U8) {
        PyErr_SetString(PyExc_ValueError, "output type must be 0 (float32), 1 (bfloat16) or "
                        "2 (uint8)");
        return NULL;
    }
    size_t esize = T == OUT_F32 ? 4 : T == OUT_BF16 ? 2 : 1;
    const uint8_t *const *s = (const uint8_t *const *)(uintptr_t)src;
    const int64_t *rs = (const int64_t *)(uintptr_t)rows, *p = (const int64_t *)(uintptr_t)params;
    const float *sc = (const float *)(uintptr_t)scale, *sh = (const float *)(uintptr_t)shift;
    v4 a = {sc[0], sc[1], sc[2], 0}, b = {sh[0], sh[1], sh[2], 0};
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        const int64_t *q = p + 5 * i;       /* top, left, h, w, flip */
        failed = crop_resize_one(s[i] + q[0] * rs[i] + q[1] * 3, rs[i], (int)q[2], (int)q[3],
                                 (int)q[4], out, (char *)(uintptr_t)dst + on * i * esize, T,
                                 oc, oy, ox, a, b);
    }
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* torchvision's colour adjustments on float images in [0, 1], in place, one image at a time:
 * brightness, contrast, saturation (blends, clamped after each) and hue (through HSV), in a
 * given order, with one factor each per image, then optionally x * scale + shift per channel
 * (the loader's normalisation, fused here). A chunk of a row at a time through planar buffers
 * that stay in L1, each op a branch-free loop the compiler vectorises. One pass over the
 * image; with contrast, two: the ops before it, written back as their mean grey is summed,
 * then the rest (nothing is computed twice). */
#define JW 256      /* pixels a chunk */
static inline float clamp01(float v) { v = v > 0.f ? v : 0.f; return v < 1.f ? v : 1.f; }

CLONES static void blend_run(float *r, float *g, float *b, int n, float w, const float *other,
                             float constant) {
    for (int i = 0; i < n; i++) {
        float o = other ? other[i] : constant;
        r[i] = clamp01(w * r[i] + (1.f - w) * o);
        g[i] = clamp01(w * g[i] + (1.f - w) * o);
        b[i] = clamp01(w * b[i] + (1.f - w) * o);
    }
}

CLONES static void luma_run(const float *r, const float *g, const float *b, int n, float *out) {
    for (int i = 0; i < n; i++) out[i] = 0.2989f * r[i] + 0.587f * g[i] + 0.114f * b[i];
}

/* the sum of n pixels' luma, in 8 lanes (a float sum in order would not vectorise) */
CLONES static double luma_sum(const float *r, const float *g, const float *b, int n) {
    v8 acc = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        acc += 0.2989f * load8(r + i) + 0.587f * load8(g + i) + 0.114f * load8(b + i);
    double sum = 0;
    for (int k = 0; k < 8; k++) sum += acc[k];
    for (; i < n; i++) sum += 0.2989f * r[i] + 0.587f * g[i] + 0.114f * b[i];
    return sum;
}

/* HSV's closed form back to RGB: channel c is max - chroma * clamp(min(k, 4 - k), 0, 1) with
 * k = (n_c + 6 h) mod 6, n = 5, 3, 1 for R, G, B: torchvision's sector table without its
 * selects, divisions or clamps (the values lie between min and max). Here in units of the
 * chroma cr, K = cr * k, which needs no division: 6 h = off + num / cr. K in [-3 cr, 13 cr]
 * (a shift within half a turn) comes into [0, 6 cr) by three conditional steps. */
static inline float hsv_channel(float K, float maxc, float cr) {
    float c6 = 6.f * cr;
    K += K < 0.f ? c6 : 0.f;
    K -= K >= c6 ? c6 : 0.f;
    K -= K >= c6 ? c6 : 0.f;
    float m = K < 4.f * cr - K ? K : 4.f * cr - K;
    m = m > 0.f ? m : 0.f;
    return maxc - (m < cr ? m : cr);
}

CLONES static void hue_run(float *r, float *g, float *b, int n, float shift) {
    float s6 = 6.f * (shift - floorf(shift + 0.5f));     /* the shift in [-1/2, 1/2) turn */
    for (int i = 0; i < n; i++) {   /* float selects only, so that it vectorises */
        float R = r[i], G = g[i], B = b[i];
        float mx = R > G ? R : G, mn = R < G ? R : G;
        float maxc = mx > B ? mx : B, minc = mn < B ? mn : B, cr = maxc - minc;
        /* torchvision's hue: the largest channel's sector (R 0, G 2, B 4) and where in it;
           grey (cr = 0) keeps every channel */
        float num = maxc == R ? G - B : (maxc == G ? B - R : R - G);
        float off = maxc == R ? 0.f : (maxc == G ? 2.f : 4.f);
        float base = num + cr * (off + s6);
        r[i] = hsv_channel(base + 5.f * cr, maxc, cr);
        g[i] = hsv_channel(base + 3.f * cr, maxc, cr);
        b[i] = hsv_channel(base + cr, maxc, cr);
    }
}

/* ops[k] in 0..3 = brightness, contrast, saturation, hue; f[op] its factor */
static void jitter_run(float *r, float *g, float *b, int n, const int *ops, int nops,
                       const float *f, float mean, float *tmp) {
    for (int k = 0; k < nops; k++) {
        int op = ops[k];
        if (op == 3) {
            hue_run(r, g, b, n, f[3]);
        } else if (op == 2) {
            luma_run(r, g, b, n, tmp);
            blend_run(r, g, b, n, f[2], tmp, 0.f);
        } else {
            blend_run(r, g, b, n, f[op], NULL, op == 0 ? 0.f : mean);
        }
    }
}

/* n pixels from p (pixel stride ox, channel stride oc) into / out of planar buffers; packed
 * pixels (channels_last) and planes (contiguous) get loops the compiler vectorises */
CLONES static void gather(const float *p, int64_t oc, int64_t ox, int n, float *r, float *g,
                          float *b) {
    if (oc == 1 && ox == 3) {
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            /* 8 packed pixels as 3 vectors: each channel's 8 values lie in lanes no other
               vector gives it, so 2 blends gather them and one permute orders them */
            v8 a = load8(p + 3 * i), c = load8(p + 3 * i + 8), e = load8(p + 3 * i + 16);
            v8 vr = SHUFFLE2(v8i, SHUFFLE2(v8i, a, c, 0, 9, 2, 3, 12, 5, 6, 15),
                                      e, 0, 1, 10, 3, 4, 13, 6, 7);
            v8 vg = SHUFFLE2(v8i, SHUFFLE2(v8i, a, c, 0, 1, 10, 3, 4, 13, 6, 7),
                                      e, 8, 1, 2, 11, 4, 5, 14, 7);
            v8 vb = SHUFFLE2(v8i, SHUFFLE2(v8i, a, c, 8, 1, 2, 11, 4, 5, 14, 7),
                                      e, 0, 9, 2, 3, 12, 5, 6, 15);
            vr = SHUFFLE1(v8i, vr, 0, 3, 6, 1, 4, 7, 2, 5);
            vg = SHUFFLE1(v8i, vg, 1, 4, 7, 2, 5, 0, 3, 6);
            vb = SHUFFLE1(v8i, vb, 2, 5, 0, 3, 6, 1, 4, 7);
            memcpy(r + i, &vr, sizeof vr);
            memcpy(g + i, &vg, sizeof vg);
            memcpy(b + i, &vb, sizeof vb);
        }
        for (; i < n; i++) { r[i] = p[3 * i]; g[i] = p[3 * i + 1]; b[i] = p[3 * i + 2]; }
    } else if (ox == 1) {
        memcpy(r, p, sizeof(float) * n);
        memcpy(g, p + oc, sizeof(float) * n);
        memcpy(b, p + 2 * oc, sizeof(float) * n);
    } else {
        for (int i = 0; i < n; i++, p += ox) { r[i] = p[0]; g[i] = p[oc]; b[i] = p[2 * oc]; }
    }
}

/* scale/shift: 3 floats each, or NULL for the values as they are */
CLONES static void scatter(float *p, int64_t oc, int64_t ox, int n, const float *r,
                           const float *g, const float *b, const float *sc, const float *sh) {
    float a0 = 1.f, a1 = 1.f, a2 = 1.f, b0 = 0.f, b1 = 0.f, b2 = 0.f;
    if (sc) { a0 = sc[0]; a1 = sc[1]; a2 = sc[2]; b0 = sh[0]; b1 = sh[1]; b2 = sh[2]; }
    if (oc == 1 && ox == 3) {
        v8 va = {a0, a1, a2, a0, a1, a2, a0, a1}, vb = {b0, b1, b2, b0, b1, b2, b0, b1};
        v8 wa = {a2, a0, a1, a2, a0, a1, a2, a0}, wb = {b2, b0, b1, b2, b0, b1, b2, b0};
        v8 xa = {a1, a2, a0, a1, a2, a0, a1, a2}, xb = {b1, b2, b0, b1, b2, b0, b1, b2};
        int i = 0;
        for (; i + 8 <= n; i += 8) {    /* gather's shuffles undone: 3 permutes, 6 blends */
            v8 vr = SHUFFLE1(v8i, load8(r + i), 0, 3, 6, 1, 4, 7, 2, 5);
            v8 vg = SHUFFLE1(v8i, load8(g + i), 5, 0, 3, 6, 1, 4, 7, 2);
            v8 vbl = SHUFFLE1(v8i, load8(b + i), 2, 5, 0, 3, 6, 1, 4, 7);
            v8 o0 = SHUFFLE2(v8i, SHUFFLE2(v8i, vr, vg, 0, 9, 2, 3, 12, 5, 6, 15),
                                      vbl, 0, 1, 10, 3, 4, 13, 6, 7);
            v8 o1 = SHUFFLE2(v8i, SHUFFLE2(v8i, vr, vg, 8, 1, 10, 11, 4, 13, 14, 7),
                                      vbl, 8, 1, 2, 11, 4, 5, 14, 7);
            v8 o2 = SHUFFLE2(v8i, SHUFFLE2(v8i, vr, vg, 8, 9, 2, 11, 12, 5, 14, 15),
                                      vbl, 0, 9, 2, 3, 12, 5, 6, 15);
            o0 = o0 * va + vb;
            o1 = o1 * wa + wb;
            o2 = o2 * xa + xb;
            memcpy(p + 3 * i, &o0, sizeof o0);
            memcpy(p + 3 * i + 8, &o1, sizeof o1);
            memcpy(p + 3 * i + 16, &o2, sizeof o2);
        }
        for (; i < n; i++) {
            p[3 * i] = a0 * r[i] + b0;
            p[3 * i + 1] = a1 * g[i] + b1;
            p[3 * i + 2] = a2 * b[i] + b2;
        }
    } else if (ox == 1) {
        for (int i = 0; i < n; i++) p[i] = a0 * r[i] + b0;
        for (int i = 0; i < n; i++) p[oc + i] = a1 * g[i] + b1;
        for (int i = 0; i < n; i++) p[2 * oc + i] = a2 * b[i] + b2;
    } else {
        for (int i = 0; i < n; i++, p += ox) {
            p[0] = a0 * r[i] + b0;
            p[oc] = a1 * g[i] + b1;
            p[2 * oc] = a2 * b[i] + b2;
        }
    }
}

static void jitter_one(float *img, int64_t oc, int64_t oy, int64_t ox, int64_t h, int64_t w,
                       const float *f, const int *ops, int nops, const float *sc,
                       const float *sh) {
    float r[JW], g[JW], b[JW], tmp[JW];
    int c = nops;           /* contrast's place: its mean is of what the ops before it make */
    for (int k = 0; k < nops; k++) if (ops[k] == 1) { c = k; break; }
    float mean = 0.f;
    if (c < nops) {
        double sum = 0;
        for (int64_t y = 0; y < h; y++)
            for (int64_t x0 = 0; x0 < w; x0 += JW) {
                int n = (int)(w - x0 < JW ? w - x0 : JW);
                float *p = img + y * oy + x0 * ox;
                gather(p, oc, ox, n, r, g, b);
                jitter_run(r, g, b, n, ops, c, f, 0.f, tmp);
                sum += luma_sum(r, g, b, n);
                if (c > 0) scatter(p, oc, ox, n, r, g, b, NULL, NULL);
            }
        mean = (float)(sum / (double)(h * w));
    }
    int from = c < nops ? c : 0;
    if (from == nops && !sc) return;
    for (int64_t y = 0; y < h; y++)
        for (int64_t x0 = 0; x0 < w; x0 += JW) {
            int n = (int)(w - x0 < JW ? w - x0 : JW);
            float *p = img + y * oy + x0 * ox;
            gather(p, oc, ox, n, r, g, b);
            jitter_run(r, g, b, n, ops + from, nops - from, f, mean, tmp);
            scatter(p, oc, ox, n, r, g, b, sc, sh);
        }
}

static PyObject *color_jitter(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    unsigned long long dst, factors, order, scale, shift;
    long long on, oc, oy, ox, h, w;
    int nops;
    if (!PyArg_ParseTuple(args, "nKLLLLLLKKiKK", &n, &dst, &on, &oc, &oy, &ox, &h, &w,
                          &factors, &order, &nops, &scale, &shift))
        return NULL;
    const float *f = (const float *)(uintptr_t)factors;
    const float *sc = (const float *)(uintptr_t)scale, *sh = (const float *)(uintptr_t)shift;
    const int64_t *o = (const int64_t *)(uintptr_t)order;
    int ops[4];
    for (int k = 0; k < nops && k < 4; k++) ops[k] = (int)o[k];
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        jitter_one((float *)(uintptr_t)dst + on * i, oc, oy, ox, h, w, f + 4 * i, ops, nops,
                   sc, sc ? sh : NULL);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* Pillow's 4-byte pixels (RGB, RGBX) -> packed RGB. The image comes through the Arrow C data
 * interface (Pillow >= 11.2 exports its memory without a copy), the output into a writable
 * buffer: the converter packs straight into its shared ring, where Pillow's own packing went
 * into a new bytes object that was then copied there. */
struct ArrowSchema {
    const char *format, *name, *metadata;
    int64_t flags, n_children;
    struct ArrowSchema **children, *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};
struct ArrowArray {
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children, *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

typedef uint8_t v16u8 __attribute__((vector_size(16)));

CLONES static void pack_rgb_run(const uint8_t *src, uint8_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 6 <= n; i += 4) {    /* 4 pixels in, 12 bytes out; the 16-byte store's last 4
                                       bytes are rewritten next, and stay inside dst */
        v16u8 v;
        memcpy(&v, src + 4 * i, 16);
        v = SHUFFLE1(v16u8, v, 0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, 0, 0, 0, 0);
        memcpy(dst + 3 * i, &v, 16);
    }
    for (; i < n; i++) {
        dst[3 * i] = src[4 * i];
        dst[3 * i + 1] = src[4 * i + 1];
        dst[3 * i + 2] = src[4 * i + 2];
    }
}

static PyObject *pack_rgb(PyObject *self, PyObject *args) {
    PyObject *schema_capsule, *array_capsule;
    Py_buffer dst;
    if (!PyArg_ParseTuple(args, "OOw*", &schema_capsule, &array_capsule, &dst)) return NULL;
    const struct ArrowSchema *schema = PyCapsule_GetPointer(schema_capsule, "arrow_schema");
    const struct ArrowArray *array = PyCapsule_GetPointer(array_capsule, "arrow_array");
    const struct ArrowArray *child = array && array->n_children == 1 ? array->children[0] : NULL;
    if (!schema || !array) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    if (strcmp(schema->format, "+w:4") || schema->n_children != 1 || !schema->children[0] ||
        strcmp(schema->children[0]->format, "C") || !child || child->n_buffers != 2 ||
        !child->buffers[1] || child->length != 4 * array->length ||
        dst.len != 3 * array->length) {
        PyBuffer_Release(&dst);
        PyErr_SetString(PyExc_ValueError, "pack_rgb: not 4 bytes per pixel, or the output is "
                                          "not 3 bytes a pixel");
        return NULL;
    }
    const uint8_t *src = (const uint8_t *)child->buffers[1] + 4 * array->offset + child->offset;
    pack_rgb_run(src, dst.buf, array->length);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

/* One outline (n points, x y float64 pairs, in the mask's pixels) ORed into an out x out
 * mask. Row r's centre line y = r + .5 meets the edges (y0 <= y < y1, either way) at xs;
 * between the 1st and 2nd crossing, the 3rd and 4th, ..., the pixels whose centres lie right
 * of the first and not right of the second (c + .5 > a, c + .5 <= b: c from floor(a + .5) to
 * floor(b + .5) - 1) are inside. Coordinates are clamped before they become integers. */
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void fill_one(const double *xy, int64_t n, uint8_t *mask, int64_t out, double *xs) {
    double lo = xy[1], hi = xy[1];
    for (int64_t i = 1; i < n; i++) {
        lo = xy[2 * i + 1] < lo ? xy[2 * i + 1] : lo;
        hi = xy[2 * i + 1] > hi ? xy[2 * i + 1] : hi;
    }
    double first = floor(lo - 0.5), last = ceil(hi + 0.5);
    int64_t r0 = first < 0 ? 0 : first > (double)out ? out : (int64_t)first;
    int64_t r1 = last < 0 ? 0 : last > (double)out ? out : (int64_t)last;
    for (int64_t r = r0; r < r1; r++) {
        double yc = (double)r + 0.5;
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t j = i + 1 == n ? 0 : i + 1;
            double x0 = xy[2 * i], y0 = xy[2 * i + 1], x1 = xy[2 * j], y1 = xy[2 * j + 1];
            if ((y0 <= yc && yc < y1) || (y1 <= yc && yc < y0))
                xs[m++] = x0 + (yc - y0) * (x1 - x0) / (y1 - y0);
        }
        if (m < 2) continue;
        if (m == 2) {
            if (xs[0] > xs[1]) { double t = xs[0]; xs[0] = xs[1]; xs[1] = t; }
        } else {
            qsort(xs, (size_t)m, sizeof(double), cmp_double);
        }
        uint8_t *row = mask + r * out;
        for (int64_t k = 0; k + 1 < m; k += 2) {
            double a = floor(xs[k] + 0.5), b = floor(xs[k + 1] + 0.5);
            int64_t c0 = a < 0 ? 0 : a > (double)out ? out : (int64_t)a;
            int64_t c1 = b < 0 ? 0 : b > (double)out ? out : (int64_t)b;
            if (c1 > c0) memset(row + c0, 1, (size_t)(c1 - c0));
        }
    }
}

static PyObject *fill_outlines(PyObject *self, PyObject *args) {
    Py_ssize_t count;
    unsigned long long xy, starts, owner, masks;
    long long out, most;
    if (!PyArg_ParseTuple(args, "nKKKKLL", &count, &xy, &starts, &owner, &masks, &out, &most))
        return NULL;
    double *xs = malloc(sizeof(double) * (size_t)(most > 0 ? most : 1));
    if (!xs) return PyErr_NoMemory();
    const int64_t *st = (const int64_t *)(uintptr_t)starts, *ow = (const int64_t *)(uintptr_t)owner;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < count; k++)
        fill_one((const double *)(uintptr_t)xy + 2 * st[k], st[k + 1] - st[k],
                 (uint8_t *)(uintptr_t)masks + ow[k] * out * out, out, xs);
    Py_END_ALLOW_THREADS
    free(xs);
    Py_RETURN_NONE;
}

/* One map of w columns, run-length encoded (n runs: lengths, a little-endian uint32 each, at
 * len, read unaligned; values at val), sampled at rows[i] x cols[j] (both non-decreasing, inside
 * the map) into out x out bytes at dst, each row mirrored where flip. The runs are walked once,
 * forward: every position asked for lies at or after the one before. */
static void sample_one(const uint8_t *len, const uint8_t *val, int64_t n, int64_t w,
                       const int64_t *rows, const int64_t *cols, int flip, uint8_t *dst,
                       int64_t out) {
    int64_t k = 0, end;
    uint32_t l;
    memcpy(&l, len, 4);
    end = l;
    for (int64_t i = 0; i < out; i++) {
        uint8_t *row = dst + i * out;
        if (i && rows[i] == rows[i - 1]) {      /* the same map row: the same output row */
            memcpy(row, row - out, (size_t)out);
            continue;
        }
        int64_t base = rows[i] * w;
        for (int64_t j = 0; j < out; j++) {
            int64_t p = base + cols[j];
            while (end <= p && k + 1 < n) {
                k++;
                memcpy(&l, len + 4 * k, 4);
                end += l;
            }
            row[flip ? out - 1 - j : j] = val[k];
        }
    }
}

static PyObject *sample_runs(PyObject *self, PyObject *args) {
    Py_ssize_t count;
    unsigned long long buf, heads, rows, cols, flips, dst;
    long long out;
    if (!PyArg_ParseTuple(args, "nKKKKKKL", &count, &buf, &heads, &rows, &cols, &flips, &dst,
                          &out))
        return NULL;
    const int64_t *hd = (const int64_t *)(uintptr_t)heads;  /* per map: offset, runs, width */
    const uint8_t *b = (const uint8_t *)(uintptr_t)buf, *fl = (const uint8_t *)(uintptr_t)flips;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < count; k++) {
        const uint8_t *len = b + hd[3 * k];
        sample_one(len, len + 4 * hd[3 * k + 1], hd[3 * k + 1], hd[3 * k + 2],
                   (const int64_t *)(uintptr_t)rows + k * out,
                   (const int64_t *)(uintptr_t)cols + k * out, fl[k],
                   (uint8_t *)(uintptr_t)dst + k * out * out, out);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"pack_rgb", pack_rgb, METH_VARARGS,
     "pack_rgb(schema_capsule, array_capsule, out): an image's Arrow export (4 bytes a pixel) "
     "into out as packed RGB; use converters.decode."},
    {"crop_resize", crop_resize, METH_VARARGS,
     "crop_resize(n, src_ptrs, row_strides, params, out_size, dst, out_type, on, oc, oy, ox, "
     "scale, shift): addresses of checked buffers; use fastdata.kernels.cpu.crop_resize."},
    {"color_jitter", color_jitter, METH_VARARGS,
     "color_jitter(n, dst, on, oc, oy, ox, h, w, factors, order, nops, scale, shift): "
     "addresses of checked buffers (scale, shift 0: none); use fastdata.kernels.cpu.color_jitter."},
    {"fill_outlines", fill_outlines, METH_VARARGS,
     "fill_outlines(count, xy, starts, owner, masks, out, most): addresses of checked buffers; "
     "use fastdata.kernels.cpu.fill_outlines."},
    {"sample_runs", sample_runs, METH_VARARGS,
     "sample_runs(count, buf, heads, rows, cols, flips, dst, out): addresses of checked "
     "buffers; use fastdata.kernels.cpu.sample_runs."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native",
                                    "fastdata's C image kernels (see fastdata/kernels/cpu.py)", -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
