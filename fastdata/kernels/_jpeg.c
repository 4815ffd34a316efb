/* A JPEG decoded only where a crop needs it, with libjpeg-turbo's own API: the rows above the
 * crop skipped (jpeg_skip_scanlines: their coefficients are read, not transformed), the
 * columns around it left out (jpeg_crop_scanline, at the image's block boundaries), the rows
 * below never read. Built where libjpeg-turbo's headers are found; fastdata decodes whole
 * images otherwise (fastdata/kernels/jpeg.py).
 *
 * decode_region(data, length, top, left, height, width, dst, row_stride, cap_h, cap_w) ->
 * (x0, cols): the image's rows top .. top+height-1, columns x0 .. x0+cols-1 (x0 <= left and
 * x0 + cols >= left + width: the block-aligned span libjpeg decodes), RGB, into dst (rows
 * row_stride bytes apart; at most cap_h rows of cap_w pixels). A JPEG libjpeg-turbo refuses,
 * or one of another size than the caller says, is a ValueError: the caller decodes it whole.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} Errors;

static void on_error(j_common_ptr cinfo) {
    Errors *e = (Errors *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, e->message);
    longjmp(e->jump, 1);
}

static void on_warning(j_common_ptr cinfo, int level) {
    /* a corrupt-data warning (level -1) is an error here: a whole decode then says why */
    if (level < 0) on_error(cinfo);
}

/* 0 on success; else -1 with e->message set. */
static int decode(const uint8_t *data, size_t length, int top, int left, int height, int width,
                  uint8_t *dst, int64_t row_stride, int cap_h, int cap_w, int expect_h,
                  int expect_w, unsigned *x0, unsigned *cols, Errors *e) {
    struct jpeg_decompress_struct cinfo;
    cinfo.err = jpeg_std_error(&e->pub);
    e->pub.error_exit = on_error;
    e->pub.emit_message = on_warning;
    jpeg_create_decompress(&cinfo);
    if (setjmp(e->jump)) {
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    jpeg_mem_src(&cinfo, data, (unsigned long)length);
    jpeg_read_header(&cinfo, TRUE);
    if ((int)cinfo.image_height != expect_h || (int)cinfo.image_width != expect_w) {
        snprintf(e->message, sizeof e->message, "JPEG is %ux%u, expected %dx%d",
                 cinfo.image_width, cinfo.image_height, expect_w, expect_h);
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    cinfo.out_color_space = JCS_RGB;
    cinfo.dct_method = JDCT_ISLOW;          /* as the whole decode (simplejpeg's default) */
    cinfo.do_fancy_upsampling = TRUE;
    jpeg_start_decompress(&cinfo);
    /* a column more each side where the image has one: the span's edge columns are upsampled
     * without their outer neighbour, so they stay outside the box */
    int lo = left > 0 ? left - 1 : 0, hi = left + width < expect_w ? left + width + 1 : expect_w;
    JDIMENSION xo = (JDIMENSION)lo, w = (JDIMENSION)(hi - lo);
    jpeg_crop_scanline(&cinfo, &xo, &w);
    if ((int)w > cap_w || height > cap_h) {
        snprintf(e->message, sizeof e->message, "the decoded span (%u columns) does not fit",
                 w);
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    if (top > 0 && jpeg_skip_scanlines(&cinfo, (JDIMENSION)top) != (JDIMENSION)top) {
        snprintf(e->message, sizeof e->message, "could not skip to row %d", top);
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    for (int y = 0; y < height; ) {
        JSAMPROW rows[1] = {dst + (int64_t)y * row_stride};
        JDIMENSION got = jpeg_read_scanlines(&cinfo, rows, 1);
        if (got == 0) {
            snprintf(e->message, sizeof e->message, "the JPEG ended at row %d", top + y);
            jpeg_destroy_decompress(&cinfo);
            return -1;
        }
        y += (int)got;
    }
    jpeg_abort_decompress(&cinfo);          /* the rows below the crop are not needed */
    jpeg_destroy_decompress(&cinfo);
    *x0 = xo;
    *cols = w;
    return 0;
}

static PyObject *decode_region(PyObject *self, PyObject *args) {
    Py_buffer data;
    int top, left, height, width, cap_h, cap_w, expect_h, expect_w;
    unsigned long long dst;
    long long row_stride;
    if (!PyArg_ParseTuple(args, "y*iiiiKLiiii", &data, &top, &left, &height, &width, &dst,
                          &row_stride, &cap_h, &cap_w, &expect_h, &expect_w))
        return NULL;
    if (top < 0 || left < 0 || height < 1 || width < 1 || top + height > expect_h
            || left + width > expect_w || row_stride < 3LL * cap_w) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "the box is not inside the image, or the buffer's "
                        "rows are shorter than cap_w pixels");
        return NULL;
    }
    Errors e;
    unsigned x0 = 0, cols = 0;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = decode((const uint8_t *)data.buf, (size_t)data.len, top, left, height, width,
                    (uint8_t *)(uintptr_t)dst, row_stride, cap_h, cap_w, expect_h, expect_w,
                    &x0, &cols, &e);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (failed) {
        PyErr_SetString(PyExc_ValueError, e.message);
        return NULL;
    }
    return Py_BuildValue("(II)", x0, cols);
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, top, left, height, width, dst, row_stride, cap_h, cap_w, "
     "image_h, image_w) -> (x0, cols); use fastdata.kernels.jpeg."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpeg(void) { return PyModule_Create(&module); }
