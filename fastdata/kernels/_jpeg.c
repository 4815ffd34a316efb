/* A JPEG decoded only where a crop needs it, with libjpeg-turbo's own API: the rows above the
 * crop skipped (jpeg_skip_scanlines: their coefficients are read, not transformed), the
 * columns around it left out (jpeg_crop_scanline, at the image's block boundaries), the rows
 * below never read. Built where libjpeg-turbo's headers are found; fastdata decodes whole
 * images otherwise (fastdata/kernels/jpeg.py).
 *
 * decode_regions(payloads, boxes, dst, row_stride, slot_stride, cap_h, cap_w, image_h, image_w)
 * -> per record (x0, cols): record k's rows top .. top+height-1 (its box, int64 top, left,
 * height, width), columns x0 .. x0+cols-1 (x0 <= left and x0 + cols >= left + width: the
 * block-aligned span libjpeg decodes), RGB, into slot k at dst + k * slot_stride (rows
 * row_stride bytes apart; at most cap_h rows of cap_w pixels). One decompressor serves the
 * batch, the GIL released throughout. A record libjpeg-turbo refuses, one of another size
 * than the caller says, or a box outside the image gives None: the caller decodes it whole.
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

/* One record into dst with the reused decompressor; 0 on success, else -1 with e->message
 * set (the decompressor is left reusable either way). */
static int decode(struct jpeg_decompress_struct *cinfo, Errors *e, const uint8_t *data,
                  size_t length, const int64_t *box, uint8_t *dst, int64_t row_stride,
                  int cap_h, int cap_w, int expect_h, int expect_w, unsigned *x0,
                  unsigned *cols) {
    /* checked as int64, before they are narrowed, and without a sum that could wrap */
    if (box[0] < 0 || box[1] < 0 || box[2] < 1 || box[3] < 1 || box[0] >= expect_h
            || box[1] >= expect_w || box[2] > expect_h - box[0] || box[3] > expect_w - box[1]
            || box[2] > cap_h) {
        snprintf(e->message, sizeof e->message, "the box is not inside the image");
        return -1;
    }
    int top = (int)box[0], left = (int)box[1], height = (int)box[2], width = (int)box[3];
    if (setjmp(e->jump)) {
        jpeg_abort_decompress(cinfo);
        return -1;
    }
    jpeg_mem_src(cinfo, data, (unsigned long)length);
    jpeg_read_header(cinfo, TRUE);
    if ((int)cinfo->image_height != expect_h || (int)cinfo->image_width != expect_w) {
        snprintf(e->message, sizeof e->message, "JPEG is %ux%u, expected %dx%d",
                 cinfo->image_width, cinfo->image_height, expect_w, expect_h);
        jpeg_abort_decompress(cinfo);
        return -1;
    }
    cinfo->out_color_space = JCS_RGB;
    cinfo->dct_method = JDCT_ISLOW;         /* as the whole decode (simplejpeg's default) */
    cinfo->do_fancy_upsampling = TRUE;
    jpeg_start_decompress(cinfo);
    /* a column more each side where the image has one: the span's edge columns are upsampled
     * without their outer neighbour, so they stay outside the box */
    int lo = left > 0 ? left - 1 : 0, hi = left + width < expect_w ? left + width + 1 : expect_w;
    JDIMENSION xo = (JDIMENSION)lo, w = (JDIMENSION)(hi - lo);
    jpeg_crop_scanline(cinfo, &xo, &w);
    if ((int)w > cap_w) {
        snprintf(e->message, sizeof e->message, "the decoded span (%u columns) does not fit",
                 w);
        jpeg_abort_decompress(cinfo);
        return -1;
    }
    if (top > 0 && jpeg_skip_scanlines(cinfo, (JDIMENSION)top) != (JDIMENSION)top) {
        snprintf(e->message, sizeof e->message, "could not skip to row %d", top);
        jpeg_abort_decompress(cinfo);
        return -1;
    }
    JSAMPROW rows[16];
    for (int y = 0; y < height; ) {
        int n = height - y < 16 ? height - y : 16;
        for (int i = 0; i < n; i++) rows[i] = dst + (int64_t)(y + i) * row_stride;
        JDIMENSION got = jpeg_read_scanlines(cinfo, rows, (JDIMENSION)n);
        if (got == 0) {
            snprintf(e->message, sizeof e->message, "the JPEG ended at row %d", top + y);
            jpeg_abort_decompress(cinfo);
            return -1;
        }
        y += (int)got;
    }
    jpeg_abort_decompress(cinfo);           /* the rows below the crop are not needed */
    *x0 = xo;
    *cols = w;
    return 0;
}

static PyObject *decode_regions(PyObject *self, PyObject *args) {
    PyObject *seq;
    Py_buffer boxes;
    unsigned long long dst;
    long long row_stride, slot_stride;
    int cap_h, cap_w, expect_h, expect_w;
    if (!PyArg_ParseTuple(args, "Oy*KLLiiii", &seq, &boxes, &dst, &row_stride, &slot_stride,
                          &cap_h, &cap_w, &expect_h, &expect_w))
        return NULL;
    PyObject *items = PySequence_Fast(seq, "payloads must be a sequence");
    if (items == NULL) {
        PyBuffer_Release(&boxes);
        return NULL;
    }
    Py_ssize_t b = PySequence_Fast_GET_SIZE(items);
    if (boxes.len != b * 4 * (Py_ssize_t)sizeof(int64_t) || row_stride < 3LL * cap_w
            || slot_stride < row_stride * cap_h) {
        PyErr_SetString(PyExc_ValueError, "boxes must be B x 4 int64, and the slots hold "
                        "cap_h rows of cap_w pixels");
        Py_DECREF(items);
        PyBuffer_Release(&boxes);
        return NULL;
    }
    Py_buffer *data = PyMem_Calloc(b ? b : 1, sizeof(Py_buffer));
    unsigned *found = PyMem_Calloc(b ? 2 * b : 1, sizeof(unsigned));
    int *failed = PyMem_Calloc(b ? b : 1, sizeof(int));
    Py_ssize_t held = 0;
    PyObject *result = NULL;
    if (data == NULL || found == NULL || failed == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < b; held++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(items, held), &data[held],
                               PyBUF_SIMPLE) < 0)
            goto done;
    Py_BEGIN_ALLOW_THREADS
    struct jpeg_decompress_struct cinfo;
    Errors e;
    cinfo.err = jpeg_std_error(&e.pub);
    e.pub.error_exit = on_error;
    e.pub.emit_message = on_warning;
    jpeg_create_decompress(&cinfo);
    for (Py_ssize_t k = 0; k < b; k++)
        failed[k] = decode(&cinfo, &e, (const uint8_t *)data[k].buf, (size_t)data[k].len,
                           (const int64_t *)boxes.buf + 4 * k,
                           (uint8_t *)(uintptr_t)dst + k * slot_stride, row_stride, cap_h,
                           cap_w, expect_h, expect_w, &found[2 * k], &found[2 * k + 1]);
    jpeg_destroy_decompress(&cinfo);
    Py_END_ALLOW_THREADS
    result = PyList_New(b);
    for (Py_ssize_t k = 0; result != NULL && k < b; k++) {
        PyObject *got = failed[k] ? Py_NewRef(Py_None)
                                  : Py_BuildValue("(II)", found[2 * k], found[2 * k + 1]);
        if (got == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyList_SET_ITEM(result, k, got);
    }
done:
    for (Py_ssize_t k = 0; k < held; k++) PyBuffer_Release(&data[k]);
    PyMem_Free(data);
    PyMem_Free(found);
    PyMem_Free(failed);
    Py_DECREF(items);
    PyBuffer_Release(&boxes);
    return result;
}

static PyMethodDef methods[] = {
    {"decode_regions", decode_regions, METH_VARARGS,
     "decode_regions(payloads, boxes, dst, row_stride, slot_stride, cap_h, cap_w, image_h, "
     "image_w) -> [(x0, cols) or None]; use fastdata.kernels.jpeg."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpeg(void) { return PyModule_Create(&module); }
