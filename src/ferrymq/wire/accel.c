/*
 * ferrymq.wire.accel: C versions of the per-message loops of the append and read paths.
 *
 * Why by hand: encoding a stored record and hashing a key cost about 2 us and 4 us per message
 * in Python (measured: `ferry bench store`), more than writing the bytes to the page cache.
 * No library does RocketMQ's record layout. The pure-Python versions in records.py stay the
 * reference: tests check that both give identical bytes and hashes.
 *
 * - encode_records(): the body of records.encode_records (layout in records.py).
 * - java_string_hash(): Java's String.hashCode over UTF-16 code units.
 * - index_put(): store/index.py's IndexFile.put for a run of keys (hash, slot, entry): the key
 *   index costs 2.1 us per key in Python, about as much as a send's encoding and write.
 * - verify_record_crc(): records.verify_record_crc_py, the broker's check of every record a pull
 *   reads (half of a pull's time in Python).
 * - scan_entries(), split_span(): the two per-entry loops of Store.get (store/queueread.py has
 *   the Python references): choosing consume-queue entries, then cutting their records out of
 *   one commit-log read and checking their CRCs (most of a pull's broker time in Python).
 * - record_infos(): the per-record loop of CommitLog.scan (replica appends, recovery): what
 *   records.record_info gives for records back to back, stopping at the first it cannot take.
 * - decode_buffers(): the read side's loop (records.decode_buffers_py): stored records back to
 *   back, checked like records.decode_record, into column buffers in Arrow's layout. Anything
 *   malformed raises ValueError and records.py re-runs the Python reference, which raises the
 *   exact error.
 * - acl_pads(), acl_signature(), acl_verify(): ACL 1.0's per-request HmacSHA1 signature
 *   (security/acl.py keeps the Python reference): the fields sorted, their values and the body
 *   hashed as they are read; about a fifth of a signed send's broker instructions in Python.
 *
 * CRC-32 (zlib polynomial) comes from zlib-ng when its Python module is loaded (it exports
 * zng_crc32; looked up with dlsym), else from a slice-by-8 table here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#define CRC_RESERVED 17 /* "CRC32" \x01 ten digits \x02 */
#define MAX_PROPERTIES 32767

typedef uint32_t (*crc32_fn)(uint32_t, const uint8_t *, uint32_t);
static PyObject *str_body, *str_properties, *str_flag; /* interned attribute names */
static crc32_fn zng_crc32 = NULL;
static uint32_t crc_table[8][256];

static void crc_table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc32_tables(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
        crc = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
              crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^
              crc_table[2][p[5]] ^ crc_table[1][p[6]] ^ crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

static uint32_t crc32_of(const uint8_t *p, size_t n) {
    if (zng_crc32 != NULL && n <= UINT32_MAX) return zng_crc32(0, p, (uint32_t)n);
    return crc32_tables(0, p, n);
}

static inline void put16(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static inline void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline void put64(uint8_t *p, uint64_t v) {
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

/* Fetch item.body, item.properties (bytes) and item.flag (int). New references on success. */
static inline uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline int64_t get64(const uint8_t *p) {
    return (int64_t)((uint64_t)get32(p) << 32 | get32(p + 4));
}

static int item_fields(PyObject *item, PyObject **body, PyObject **props, long *flag) {
    PyObject *flag_obj = NULL;
    *body = PyObject_GetAttr(item, str_body);
    *props = *body ? PyObject_GetAttr(item, str_properties) : NULL;
    flag_obj = *props ? PyObject_GetAttr(item, str_flag) : NULL;
    if (flag_obj == NULL) goto fail;
    if (!PyBytes_Check(*body) || !PyBytes_Check(*props)) {
        PyErr_SetString(PyExc_TypeError, "body and properties must be bytes");
        goto fail;
    }
    *flag = PyLong_AsLong(flag_obj);
    Py_DECREF(flag_obj);
    if (*flag == -1 && PyErr_Occurred()) goto fail_refs;
    if (*flag < INT32_MIN || *flag > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "flag does not fit in an int32");
        goto fail_refs;
    }
    return 0;
fail:
    Py_XDECREF(flag_obj);
fail_refs:
    Py_XDECREF(*body);
    Py_XDECREF(*props);
    *body = *props = NULL;
    return -1;
}

static PyObject *encode_records(PyObject *self, PyObject *args) {
    PyObject *items;
    const uint8_t *topic_part, *born_host, *store_host;
    Py_ssize_t topic_len, born_len, store_len;
    int magic, queue_id, sys_flag, reconsume_times, step;
    long long first_queue_offset, first_log_offset, born_ts, store_ts, prepared_offset;
    if (!PyArg_ParseTuple(args, "O!y#iiLiLiLy#Ly#iL", &PyList_Type, &items, &topic_part,
                          &topic_len, &magic, &queue_id, &first_queue_offset, &step,
                          &first_log_offset, &sys_flag, &born_ts, &born_host, &born_len,
                          &store_ts, &store_host, &store_len, &reconsume_times, &prepared_offset))
        return NULL;
    if ((born_len != 8 && born_len != 20) || (store_len != 8 && store_len != 20)) {
        PyErr_SetString(PyExc_ValueError, "hosts must be 8 or 20 packed bytes");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(items);
    Py_ssize_t head = 48 + born_len + 8 + store_len + 12 + 4;
    Py_ssize_t overhead = head + topic_len + 2 + CRC_RESERVED;
    PyObject **bodies = PyMem_Calloc(count ? count : 1, 2 * sizeof(PyObject *));
    long *flags = PyMem_Calloc(count ? count : 1, sizeof(long));
    PyObject *out = NULL, *sizes = NULL, *result = NULL;
    if (bodies == NULL || flags == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject **pair = bodies + 2 * i;
        if (item_fields(PyList_GET_ITEM(items, i), &pair[0], &pair[1], &flags[i]) < 0) goto done;
        Py_ssize_t props = PyBytes_GET_SIZE(pair[1]);
        const char *p = PyBytes_AS_STRING(pair[1]);
        Py_ssize_t stored_props = props + (props > 0 && p[props - 1] != 2 ? 1 : 0);
        if (stored_props + CRC_RESERVED > MAX_PROPERTIES) {
            PyErr_Format(PyExc_ValueError, "properties of %zd bytes exceed %d", stored_props,
                         MAX_PROPERTIES);
            goto done;
        }
        total += overhead + PyBytes_GET_SIZE(pair[0]) + stored_props;
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    sizes = PyList_New(count);
    if (out == NULL || sizes == NULL) goto done;
    uint8_t *base = (uint8_t *)PyBytes_AS_STRING(out);
    uint8_t *p = base;
    uint32_t flags_v6 = (born_len == 20 ? 0x10u : 0) | (store_len == 20 ? 0x20u : 0);
    uint32_t stored_sys_flag = ((uint32_t)sys_flag & ~0x30u) | flags_v6;
    long long log_offset = first_log_offset;
    long long queue_offset = step ? first_queue_offset : 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *body = bodies[2 * i], *props = bodies[2 * i + 1];
        Py_ssize_t body_len = PyBytes_GET_SIZE(body), props_len = PyBytes_GET_SIZE(props);
        const uint8_t *props_data = (const uint8_t *)PyBytes_AS_STRING(props);
        int add_sep = props_len > 0 && props_data[props_len - 1] != 2;
        Py_ssize_t size = overhead + body_len + props_len + add_sep;
        const uint8_t *body_data = (const uint8_t *)PyBytes_AS_STRING(body);
        uint8_t *r = p;
        put32(r, (uint32_t)size);
        put32(r + 4, (uint32_t)magic);
        put32(r + 8, crc32_of(body_data, (size_t)body_len) & 0x7FFFFFFFu);
        put32(r + 12, (uint32_t)queue_id);
        put32(r + 16, (uint32_t)flags[i]);
        put64(r + 20, (uint64_t)queue_offset);
        put64(r + 28, (uint64_t)log_offset);
        put32(r + 36, stored_sys_flag);
        put64(r + 40, (uint64_t)born_ts);
        r += 48;
        memcpy(r, born_host, (size_t)born_len);
        r += born_len;
        put64(r, (uint64_t)store_ts);
        r += 8;
        memcpy(r, store_host, (size_t)store_len);
        r += store_len;
        put32(r, (uint32_t)reconsume_times);
        put64(r + 4, (uint64_t)prepared_offset);
        put32(r + 12, (uint32_t)body_len);
        r += 16;
        memcpy(r, body_data, (size_t)body_len);
        r += body_len;
        memcpy(r, topic_part, (size_t)topic_len);
        r += topic_len;
        put16(r, (uint32_t)(props_len + add_sep + CRC_RESERVED));
        r += 2;
        memcpy(r, props_data, (size_t)props_len);
        r += props_len;
        if (add_sep) *r++ = 2;
        uint32_t crc = crc32_of(p, (size_t)(r - p)) & 0x7FFFFFFFu;
        memcpy(r, "CRC32\x01", 6);
        for (int d = 9; d >= 0; d--) {
            r[6 + d] = (uint8_t)('0' + crc % 10);
            crc /= 10;
        }
        r[16] = 2;
        p += size;
        PyObject *n = PyLong_FromSsize_t(size);
        if (n == NULL) goto done;
        PyList_SET_ITEM(sizes, i, n);
        log_offset += size;
        queue_offset += step;
    }
    result = PyTuple_Pack(2, out, sizes);
done:
    if (bodies != NULL)
        for (Py_ssize_t i = 0; i < 2 * count; i++) Py_XDECREF(bodies[i]);
    PyMem_Free(bodies);
    PyMem_Free(flags);
    Py_XDECREF(out);
    Py_XDECREF(sizes);
    return result;
}

/* measure(items, overhead) -> (total stored bytes, largest body): what an append reserves. */
static PyObject *measure(PyObject *self, PyObject *args) {
    PyObject *items;
    Py_ssize_t overhead;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &items, &overhead)) return NULL;
    Py_ssize_t total = 0, largest = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        PyObject *body = PyObject_GetAttr(item, str_body);
        PyObject *props = body ? PyObject_GetAttr(item, str_properties) : NULL;
        if (props == NULL || !PyBytes_Check(body) || !PyBytes_Check(props)) {
            if (props != NULL) PyErr_SetString(PyExc_TypeError, "body and properties must be bytes");
            Py_XDECREF(body);
            Py_XDECREF(props);
            return NULL;
        }
        Py_ssize_t body_len = PyBytes_GET_SIZE(body), props_len = PyBytes_GET_SIZE(props);
        const char *p = PyBytes_AS_STRING(props);
        total += overhead + body_len + props_len + (props_len > 0 && p[props_len - 1] != 2);
        if (body_len > largest) largest = body_len;
        Py_DECREF(body);
        Py_DECREF(props);
    }
    return Py_BuildValue("(nn)", total, largest);
}

/* Java's String.hashCode continued over `text` from `h` (UTF-16 code units). */
static uint32_t java_hash_from(uint32_t h, PyObject *text) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c > 0xFFFF) { /* a surrogate pair, as Java stores it */
            c -= 0x10000;
            h = 31 * h + (0xD800 + (c >> 10));
            h = 31 * h + (0xDC00 + (c & 0x3FF));
        } else {
            h = 31 * h + c;
        }
    }
    return h;
}

static PyObject *java_string_hash(PyObject *self, PyObject *arg) {
    if (!PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "java_string_hash() takes a str");
        return NULL;
    }
    return PyLong_FromLong((long)(int32_t)java_hash_from(0, arg));
}

#define INDEX_HEADER 40
#define INDEX_ENTRY 20

/* index_put(buffer, slot_count, entries_at, index_count, begin_timestamp_ms, keys) ->
 * (index_count, slots_taken): store/index.py's IndexFile.put (the reference) for each
 * (topic, key, log_offset, store_timestamp_ms) of `keys`, in order, into the mapped file. The
 * caller checks that they fit; this checks again and writes nothing if they do not. */
static PyObject *index_put(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t slot_count, entries_at;
    long long index_count, begin_ts;
    PyObject *keys;
    if (!PyArg_ParseTuple(args, "w*nnLLO!", &buf, &slot_count, &entries_at, &index_count,
                          &begin_ts, &PyList_Type, &keys))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (slot_count <= 0 || index_count < 1 || entries_at < INDEX_HEADER + slot_count * 4 ||
        entries_at + (index_count + n) * INDEX_ENTRY > buf.len) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "index entries do not fit the file");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* check every item before writing any */
        PyObject *item = PyList_GET_ITEM(keys, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(item, 0)) ||
            !PyUnicode_Check(PyTuple_GET_ITEM(item, 1)) ||
            !PyLong_Check(PyTuple_GET_ITEM(item, 2)) || !PyLong_Check(PyTuple_GET_ITEM(item, 3))) {
            PyBuffer_Release(&buf);
            PyErr_SetString(PyExc_TypeError, "keys are (topic, key, log_offset, timestamp_ms)");
            return NULL;
        }
    }
    uint8_t *map = (uint8_t *)buf.buf;
    long long taken = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(keys, i);
        long long log_offset = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 2));
        long long ts = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 3));
        if (PyErr_Occurred()) {
            PyBuffer_Release(&buf);
            return NULL;
        }
        uint32_t h = java_hash_from(0, PyTuple_GET_ITEM(item, 0));
        h = 31 * h + '#';
        h = java_hash_from(h, PyTuple_GET_ITEM(item, 1));
        int32_t signed_hash = (int32_t)h;
        /* abs(); abs(-2**31) does not fit an int32: 0, as index_key_hash gives */
        int32_t key_hash = signed_hash == INT32_MIN ? 0 : (signed_hash < 0 ? -signed_hash : signed_hash);
        uint8_t *slot = map + INDEX_HEADER + (Py_ssize_t)(key_hash % slot_count) * 4;
        int32_t head = (int32_t)get32(slot);
        if (!(0 < head && head < index_count)) head = 0;
        long long diff = ts - begin_ts;
        diff = diff < 0 ? 0 : diff / 1000;
        if (diff > 0x7FFFFFFF) diff = 0x7FFFFFFF;
        uint8_t *entry = map + entries_at + index_count * INDEX_ENTRY;
        put32(entry, (uint32_t)key_hash);
        put64(entry + 4, (uint64_t)log_offset);
        put32(entry + 12, (uint32_t)diff);
        put32(entry + 16, (uint32_t)head);
        put32(slot, (uint32_t)index_count);
        if (head == 0) taken++;
        index_count++;
    }
    PyBuffer_Release(&buf);
    return Py_BuildValue("(LL)", index_count, taken);
}

#define MAGIC_V1 ((uint32_t)0xDAA320A7u)
#define MAGIC_V2 ((uint32_t)0xDAA320ABu)
#define MIN_RECORD (48 + 8 + 8 + 8 + 12 + 4 + 1 + 2)

/* The whole-record CRC property at the record's end ("CRC32" \x01 ten digits \x02), or -1. */
static long long stored_record_crc(const uint8_t *tail) {
    if (memcmp(tail, "CRC32\x01", 6) != 0 || tail[CRC_RESERVED - 1] != 2) return -1;
    long long value = 0;
    for (int i = 6; i < CRC_RESERVED - 1; i++) {
        if (tail[i] < '0' || tail[i] > '9') return -1;
        value = value * 10 + (tail[i] - '0');
    }
    return value;
}

static int append_new(PyObject *list, PyObject *item) {
    if (item == NULL) return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

static PyObject *malformed(Py_ssize_t pos) {
    PyErr_Format(PyExc_ValueError, "malformed record at %zd", pos);
    return NULL;
}

/* Whether `n` bytes are UTF-8 that Python's strict decoder accepts (no overlong forms, no
 * surrogates, nothing above U+10FFFF). */
static int utf8_valid(const uint8_t *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0) {
            len = 2;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (i + len > n) return 0;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
            (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

/* Where the parts of the stored record at `r` lie (records.py _parse), or -1: malformed. */
typedef struct {
    int64_t total, born_len, body_at, body_len, topic_at, topic_len, props_at, props_len;
} layout_t;

static int parse_layout(const uint8_t *r, Py_ssize_t left, layout_t *out) {
    if (left < 8) return -1;
    int64_t total = (int32_t)get32(r);
    uint32_t magic = get32(r + 4);
    if ((magic != MAGIC_V1 && magic != MAGIC_V2) || total < MIN_RECORD || total > left) return -1;
    uint32_t sys_flag = get32(r + 36);
    int64_t born_len = sys_flag & 0x10 ? 20 : 8, store_len = sys_flag & 0x20 ? 20 : 8;
    int64_t at = 48 + born_len + 8 + store_len + 12;
    if (at + 4 > total) return -1;
    int64_t body_len = (int32_t)get32(r + at);
    at += 4;
    int64_t topic_width = magic == MAGIC_V2 ? 2 : 1;
    if (body_len < 0 || at + body_len + topic_width > total) return -1;
    out->body_at = at;
    out->body_len = body_len;
    at += body_len;
    int64_t topic_len = magic == MAGIC_V2 ? (int16_t)(r[at] << 8 | r[at + 1]) : r[at];
    at += topic_width;
    if (topic_len < 0 || at + topic_len + 2 > total) return -1;
    out->topic_at = at;
    out->topic_len = topic_len;
    at += topic_len;
    int64_t props_len = (int16_t)(r[at] << 8 | r[at + 1]);
    at += 2;
    if (props_len < 0 || at + props_len != total) return -1;
    out->props_at = at;
    out->props_len = props_len;
    out->total = total;
    out->born_len = born_len;
    return 0;
}

/* Native byte order, as Arrow lays out its buffers. */
static inline void put_i32(uint8_t *p, int32_t v) { memcpy(p, &v, 4); }
static inline void put_i64(uint8_t *p, int64_t v) { memcpy(p, &v, 8); }

/* The value of the last `name\x01value` item of stored properties (items split by \x02; an
 * item counts only with exactly one \x01, as properties.decode_properties reads them), or NULL. */
static const uint8_t *find_property(const uint8_t *p, int64_t n, const char *name,
                                    size_t name_len, int64_t *value_len) {
    const uint8_t *found = NULL, *end = p + n;
    while (p < end) {
        const uint8_t *stop = memchr(p, 0x02, (size_t)(end - p));
        if (stop == NULL) stop = end;
        const uint8_t *sep = memchr(p, 0x01, (size_t)(stop - p));
        if (sep != NULL && memchr(sep + 1, 0x01, (size_t)(stop - sep - 1)) == NULL &&
            (size_t)(sep - p) == name_len && memcmp(p, name, name_len) == 0) {
            found = sep + 1;
            *value_len = stop - found;
        }
        p = stop + 1;
    }
    return found;
}

static const uint8_t *find_key(const uint8_t *p, int64_t n, int64_t *key_len) {
    return find_property(p, n, "KEYS", 4, key_len);
}

/* records.decode_buffers_py: stored records back to back into Arrow-layout column buffers. One
 * pass finds the layout of every record (sizing the buffers), a second checks CRCs and UTF-8
 * and fills them. */
static PyObject *decode_buffers(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *buf = view.buf;
    Py_ssize_t len = view.len, pos = 0, count = 0;
    int64_t body_bytes = 0, props_bytes = 0, key_len = 0;
    PyObject *cols[10] = {NULL}, *result = NULL;
    layout_t l;
    while (pos < len) {
        if (parse_layout(buf + pos, len - pos, &l) < 0) {
            malformed(pos);
            goto done;
        }
        count++;
        body_bytes += l.body_len;
        props_bytes += l.props_len;
        pos += l.total;
    }
    if (body_bytes > INT32_MAX || props_bytes > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "more than 2 GiB of bodies or properties");
        goto done;
    }
    /* queue offsets, born and store timestamps; body ends and bodies; property ends and
     * properties; key validity, ends and keys (at most the properties: shrunk when filled) */
    Py_ssize_t sizes[10] = {count * 8,       count * 8,       count * 8,       (count + 1) * 4,
                            body_bytes,      (count + 1) * 4, props_bytes,     (count + 7) / 8,
                            (count + 1) * 4, props_bytes};
    for (int c = 0; c < 10; c++) {
        cols[c] = PyBytes_FromStringAndSize(NULL, sizes[c]);
        if (cols[c] == NULL) goto done;
    }
    uint8_t *offsets = (uint8_t *)PyBytes_AS_STRING(cols[0]);
    uint8_t *born = (uint8_t *)PyBytes_AS_STRING(cols[1]);
    uint8_t *stored = (uint8_t *)PyBytes_AS_STRING(cols[2]);
    uint8_t *body_ends = (uint8_t *)PyBytes_AS_STRING(cols[3]);
    uint8_t *bodies = (uint8_t *)PyBytes_AS_STRING(cols[4]);
    uint8_t *props_ends = (uint8_t *)PyBytes_AS_STRING(cols[5]);
    uint8_t *props = (uint8_t *)PyBytes_AS_STRING(cols[6]);
    uint8_t *key_valid = (uint8_t *)PyBytes_AS_STRING(cols[7]);
    uint8_t *key_ends = (uint8_t *)PyBytes_AS_STRING(cols[8]);
    uint8_t *keys = (uint8_t *)PyBytes_AS_STRING(cols[9]);
    const uint8_t *topic_seen = NULL; /* the last topic bytes checked to be UTF-8 */
    int64_t topic_seen_len = 0, body_end = 0, props_end = 0, key_end = 0;
    put_i32(body_ends, 0);
    put_i32(props_ends, 0);
    put_i32(key_ends, 0);
    memset(key_valid, 0, (size_t)sizes[7]);
    pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const uint8_t *r = buf + pos;
        parse_layout(r, len - pos, &l);
        int64_t total = l.total;
        if ((crc32_of(r + l.body_at, (size_t)l.body_len) & 0x7FFFFFFFu) != get32(r + 8)) {
            malformed(pos);
            goto done;
        }
        long long whole = stored_record_crc(r + total - CRC_RESERVED);
        if (whole >= 0 &&
            (long long)(crc32_of(r, (size_t)(total - CRC_RESERVED)) & 0x7FFFFFFFu) != whole) {
            malformed(pos);
            goto done;
        }
        const uint8_t *topic = r + l.topic_at;
        if (topic_seen == NULL || topic_seen_len != l.topic_len ||
            memcmp(topic_seen, topic, (size_t)l.topic_len) != 0) {
            if (!utf8_valid(topic, l.topic_len)) {
                malformed(pos);
                goto done;
            }
            topic_seen = topic;
            topic_seen_len = l.topic_len;
        }
        if (!utf8_valid(r + l.props_at, l.props_len)) {
            malformed(pos);
            goto done;
        }
        put_i64(offsets + i * 8, get64(r + 20));
        put_i64(born + i * 8, get64(r + 40));
        put_i64(stored + i * 8, get64(r + 48 + l.born_len));
        memcpy(bodies + body_end, r + l.body_at, (size_t)l.body_len);
        body_end += l.body_len;
        put_i32(body_ends + (i + 1) * 4, (int32_t)body_end);
        memcpy(props + props_end, r + l.props_at, (size_t)l.props_len);
        props_end += l.props_len;
        put_i32(props_ends + (i + 1) * 4, (int32_t)props_end);
        const uint8_t *key = find_key(r + l.props_at, l.props_len, &key_len);
        if (key != NULL && key_len > 0) { /* an empty KEYS is no key */
            key_valid[i / 8] |= (uint8_t)(1u << (i % 8));
            memcpy(keys + key_end, key, (size_t)key_len);
            key_end += key_len;
        }
        put_i32(key_ends + (i + 1) * 4, (int32_t)key_end);
        pos += total;
    }
    if (_PyBytes_Resize(&cols[9], (Py_ssize_t)key_end) < 0) goto done;
    result = Py_BuildValue("(nOOOOOOOOOO)", count, cols[0], cols[1], cols[2], cols[3], cols[4],
                           cols[5], cols[6], cols[7], cols[8], cols[9]);
done:
    PyBuffer_Release(&view);
    for (int c = 0; c < 10; c++) Py_XDECREF(cols[c]);
    return result;
}

/* records.verify_record_crc_py over `len` bytes at `r`: body CRC and whole-record CRC hold. */
static int record_crc_ok(const uint8_t *r, Py_ssize_t len, int require) {
    if (len < MIN_RECORD) return 0;
    uint32_t sys_flag = get32(r + 36);
    Py_ssize_t at = 48 + (sys_flag & 0x10 ? 20 : 8) + 8 + (sys_flag & 0x20 ? 20 : 8) + 12;
    int64_t body_len = at + 4 <= len ? (int32_t)get32(r + at) : -1;
    if (body_len < 0 || at + 4 + body_len > len ||
        (crc32_of(r + at + 4, (size_t)body_len) & 0x7FFFFFFFu) != get32(r + 8))
        return 0;
    long long whole = stored_record_crc(r + len - CRC_RESERVED);
    if (whole < 0) return !require;
    return (long long)(crc32_of(r, (size_t)(len - CRC_RESERVED)) & 0x7FFFFFFFu) == whole;
}

static PyObject *verify_record_crc(PyObject *self, PyObject *args) {
    Py_buffer view;
    int require;
    if (!PyArg_ParseTuple(args, "y*p", &view, &require)) return NULL;
    int ok = record_crc_ok(view.buf, view.len, require);
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

/* A property's value as a str (the properties are valid UTF-8), or None when absent. */
static PyObject *property_str(const uint8_t *props, int64_t n, const char *name, size_t len) {
    int64_t value_len = 0;
    const uint8_t *value = find_property(props, n, name, len, &value_len);
    if (value == NULL) Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8((const char *)value, (Py_ssize_t)value_len, "strict");
}

/* records.record_info over records back to back (store/commitlog.py _scan's fast path): from
 * `pos`, one (topic, queue_id, queue_offset, log_offset, size, tags_code, store_timestamp_ms,
 * sys_flag, KEYS value or None, UNIQ_KEY value or None) per record while the record is whole
 * before `limit`, well formed, its CRCs hold (with check_crc), its topic is UTF-8 and it stores
 * the log offset `log_offset` plus its distance from `pos`. Stops at the first that is not (a
 * zero header, a blank record, one that does not fit, anything wrong): the caller looks at that
 * one with the Python reference. Returns (tuples, the position it stopped at). */
static PyObject *record_infos(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, limit;
    int check_crc, require;
    long long first_log_offset;
    if (!PyArg_ParseTuple(args, "y*nnppL", &view, &pos, &limit, &check_crc, &require,
                          &first_log_offset))
        return NULL;
    if (limit > view.len) limit = view.len;
    const uint8_t *buf = view.buf;
    Py_ssize_t start = pos;
    PyObject *infos = PyList_New(0);
    layout_t l;
    while (infos != NULL && pos >= 0 && pos + 8 <= limit) {
        const uint8_t *r = buf + pos;
        if (parse_layout(r, limit - pos, &l) < 0) break;
        if (check_crc && !record_crc_ok(r, (Py_ssize_t)l.total, require)) break;
        if (get64(r + 28) != first_log_offset + (pos - start)) break;
        if (!utf8_valid(r + l.topic_at, (Py_ssize_t)l.topic_len)) break;
        const uint8_t *props = r + l.props_at;
        PyObject *tags = NULL, *keys = NULL, *uniq = NULL, *topic = NULL;
        long tags_code = 0;
        if (utf8_valid(props, (Py_ssize_t)l.props_len)) {
            tags = property_str(props, l.props_len, "TAGS", 4);
            keys = tags ? property_str(props, l.props_len, "KEYS", 4) : NULL;
            uniq = keys ? property_str(props, l.props_len, "UNIQ_KEY", 8) : NULL;
        } else { /* index_properties: such properties index nothing */
            tags = Py_NewRef(Py_None);
            keys = Py_NewRef(Py_None);
            uniq = Py_NewRef(Py_None);
        }
        if (uniq != NULL && tags != Py_None && PyUnicode_GET_LENGTH(tags) > 0) {
            PyObject *hash = java_string_hash(NULL, tags);
            tags_code = hash ? PyLong_AsLong(hash) : -1;
            Py_XDECREF(hash);
            if (hash == NULL) Py_CLEAR(uniq);
        }
        if (uniq != NULL)
            topic = PyUnicode_DecodeUTF8((const char *)r + l.topic_at, (Py_ssize_t)l.topic_len,
                                         "strict");
        PyObject *info = NULL;
        if (topic != NULL)
            info = Py_BuildValue("(OiLLLlLiOO)", topic, (int)(int32_t)get32(r + 12),
                                 (long long)get64(r + 20), (long long)get64(r + 28),
                                 (long long)l.total, tags_code,
                                 (long long)get64(r + 48 + l.born_len),
                                 (int)(int32_t)get32(r + 36), keys, uniq);
        Py_XDECREF(topic);
        Py_XDECREF(tags);
        Py_XDECREF(keys);
        Py_XDECREF(uniq);
        if (info == NULL || append_new(infos, info) < 0) Py_CLEAR(infos);
        else pos += (Py_ssize_t)l.total;
    }
    PyBuffer_Release(&view);
    if (infos == NULL) return NULL;
    return Py_BuildValue("(Nn)", infos, pos);
}

/* Consume-queue entries (store/consumequeue.py): int64 log offset, int32 size, int64 tags code,
 * big-endian; a filler has size BLANK_ENTRY_SIZE. */
#define ENTRY_BYTES 20
#define BLANK_ENTRY_SIZE 0x7FFFFFFF

/* store/queueread.py scan_entries_py: choose the entries a read returns, in runs of consecutive
 * entries whose records lie back to back in the commit log. */
static PyObject *scan_entries(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long max_chosen, max_scan, max_bytes, used, min_log, span_bytes;
    int have_chosen;
    PyObject *codes, *runs = NULL, *result = NULL;
    if (!PyArg_ParseTuple(args, "y*LLLLpLOL", &view, &max_chosen, &max_scan, &max_bytes, &used,
                          &have_chosen, &min_log, &codes, &span_bytes))
        return NULL;
    if (codes != Py_None && !PyAnySet_Check(codes)) {
        PyErr_SetString(PyExc_TypeError, "codes must be a set or frozenset of ints, or None");
        goto done;
    }
    runs = PyList_New(0);
    if (runs == NULL) goto done;
    const uint8_t *data = view.buf;
    Py_ssize_t count = view.len / ENTRY_BYTES;
    long long scanned = 0, chosen = 0;
    int byte_limited = 0, saw_removed = 0;
    /* the open run: entries [run_first, run_first + run_count), log bytes [run_start, run_end) */
    Py_ssize_t run_first = 0, run_count = 0;
    int64_t run_start = 0, run_end = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (chosen >= max_chosen || scanned >= max_scan) break;
        const uint8_t *e = data + i * ENTRY_BYTES;
        int64_t log_offset = get64(e), size = (int32_t)get32(e + 8), tags = get64(e + 12);
        if ((have_chosen || chosen > 0) && used + size > max_bytes) {
            byte_limited = 1;
            break;
        }
        scanned++;
        int take = log_offset >= 0 && size > 0 && size != BLANK_ENTRY_SIZE;
        if (take && log_offset < min_log) {
            saw_removed = 1;
            take = 0;
        }
        if (take && codes != Py_None) {
            PyObject *code = PyLong_FromLongLong(tags);
            take = code == NULL ? -1 : PySet_Contains(codes, code);
            Py_XDECREF(code);
            if (take < 0) goto done;
        }
        if (!take) continue;
        chosen++;
        used += size;
        if (run_count > 0 && run_first + run_count == i && log_offset == run_end &&
            run_end - run_start < span_bytes) {
            run_count++;
            run_end += size;
            continue;
        }
        if (run_count > 0 &&
            append_new(runs, Py_BuildValue("(LLnn)", (long long)run_start, (long long)run_end,
                                           run_first, run_count)) < 0)
            goto done;
        run_first = i;
        run_count = 1;
        run_start = log_offset;
        run_end = log_offset + size;
    }
    if (run_count > 0 &&
        append_new(runs, Py_BuildValue("(LLnn)", (long long)run_start, (long long)run_end,
                                       run_first, run_count)) < 0)
        goto done;
    result = Py_BuildValue("(LLLiiO)", scanned, chosen, used, byte_limited, saw_removed, runs);
done:
    PyBuffer_Release(&view);
    Py_XDECREF(runs);
    return result;
}

/* store/queueread.py split_span_py: the records of a run, cut out of its commit-log span by the
 * entries' sizes; with check_crc, stops at the first whose CRCs fail and returns its index. */
static PyObject *split_span(PyObject *self, PyObject *args) {
    Py_buffer span, entries;
    Py_ssize_t first, count, bad = -1;
    int check_crc, require;
    PyObject *records = NULL, *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*nnpp", &span, &entries, &first, &count, &check_crc,
                          &require))
        return NULL;
    if (first < 0 || count < 0 || (first + count) * ENTRY_BYTES > entries.len) {
        PyErr_SetString(PyExc_ValueError, "the run is not within the entries");
        goto done;
    }
    records = PyList_New(0);
    if (records == NULL) goto done;
    const uint8_t *e = (const uint8_t *)entries.buf + first * ENTRY_BYTES;
    Py_ssize_t pos = 0;
    for (Py_ssize_t k = 0; k < count; k++, e += ENTRY_BYTES) {
        int64_t size = (int32_t)get32(e + 8);
        if (size <= 0 || pos + size > span.len) {
            PyErr_SetString(PyExc_ValueError, "the span is shorter than the run's entries");
            goto done;
        }
        const uint8_t *r = (const uint8_t *)span.buf + pos;
        if (check_crc && !record_crc_ok(r, (Py_ssize_t)size, require)) {
            bad = k;
            break;
        }
        if (append_new(records, PyBytes_FromStringAndSize((const char *)r, size)) < 0) goto done;
        pos += size;
    }
    result = Py_BuildValue("(On)", records, bad);
done:
    PyBuffer_Release(&span);
    PyBuffer_Release(&entries);
    Py_XDECREF(records);
    return result;
}

/* ---- ACL 1.0's request signature: Base64(HmacSHA1(secretKey, content)) (security/acl.py) ----
 *
 * The content is RocketMQ's `AclUtils.combineRequestContent`: the values of the request's
 * extFields sorted by key (code point order, as acl.py's `sorted`), Signature left out (and
 * _UNIQUE_KEY_QUERY for requests up to V4_9_3), in UTF-8 (lone surrogates as surrogatepass
 * writes them), then the body. It is hashed as it is read, never joined into one buffer.
 * SHA-1's block function is OpenSSL's when Python's _hashlib has loaded libcrypto (dlsym, no
 * build dependency), else the portable one here (FIPS 180-4); acl.py keeps the reference in
 * Python (hashlib) and unit tests hold all of them equal. */

#define SHA1_BLOCK 64
#define ACL_PADS_BYTES 40       /* HMAC's inner and outer SHA-1 states after the key block */
#define ACL_SIGNATURE_CHARS 28  /* Base64 of a 20-byte digest */
#define ACL_SORT_ON_STACK 32

typedef struct {
    uint32_t h[5];
    uint64_t total;
    uint8_t buf[SHA1_BLOCK];
    size_t used;
} sha1_ctx;

#define ROL32(x, n) (((x) << (n)) | ((x) >> (32 - (n))))

/* One 64-byte block into the state: the rounds unrolled over a 16-word schedule, as in Steve
 * Reid's public-domain SHA-1 (a loop over an 80-word schedule ran twice the instructions). */
static void sha1_block_c(uint32_t h[5], const uint8_t *p) {
    uint32_t w[16], a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
#define SHA1_W0(i) (w[i] = (uint32_t)p[4 * (i)] << 24 | (uint32_t)p[4 * (i) + 1] << 16 | \
                           (uint32_t)p[4 * (i) + 2] << 8 | (uint32_t)p[4 * (i) + 3])
#define SHA1_W(i)                                                                          \
    (w[(i)&15] = ROL32(w[((i) + 13) & 15] ^ w[((i) + 8) & 15] ^ w[((i) + 2) & 15] ^ w[(i)&15], 1))
#define R0(v, x, y, z, u, i) \
    u += ((x & (y ^ z)) ^ z) + SHA1_W0(i) + 0x5A827999u + ROL32(v, 5), x = ROL32(x, 30);
#define R1(v, x, y, z, u, i) \
    u += ((x & (y ^ z)) ^ z) + SHA1_W(i) + 0x5A827999u + ROL32(v, 5), x = ROL32(x, 30);
#define R2(v, x, y, z, u, i) \
    u += (x ^ y ^ z) + SHA1_W(i) + 0x6ED9EBA1u + ROL32(v, 5), x = ROL32(x, 30);
#define R3(v, x, y, z, u, i) \
    u += (((x | y) & z) | (x & y)) + SHA1_W(i) + 0x8F1BBCDCu + ROL32(v, 5), x = ROL32(x, 30);
#define R4(v, x, y, z, u, i) \
    u += (x ^ y ^ z) + SHA1_W(i) + 0xCA62C1D6u + ROL32(v, 5), x = ROL32(x, 30);
    R0(a, b, c, d, e, 0); R0(e, a, b, c, d, 1); R0(d, e, a, b, c, 2);
    R0(c, d, e, a, b, 3); R0(b, c, d, e, a, 4);
    R0(a, b, c, d, e, 5); R0(e, a, b, c, d, 6); R0(d, e, a, b, c, 7);
    R0(c, d, e, a, b, 8); R0(b, c, d, e, a, 9);
    R0(a, b, c, d, e, 10); R0(e, a, b, c, d, 11); R0(d, e, a, b, c, 12);
    R0(c, d, e, a, b, 13); R0(b, c, d, e, a, 14);
    R0(a, b, c, d, e, 15); R1(e, a, b, c, d, 16); R1(d, e, a, b, c, 17);
    R1(c, d, e, a, b, 18); R1(b, c, d, e, a, 19);
    R2(a, b, c, d, e, 20); R2(e, a, b, c, d, 21); R2(d, e, a, b, c, 22);
    R2(c, d, e, a, b, 23); R2(b, c, d, e, a, 24);
    R2(a, b, c, d, e, 25); R2(e, a, b, c, d, 26); R2(d, e, a, b, c, 27);
    R2(c, d, e, a, b, 28); R2(b, c, d, e, a, 29);
    R2(a, b, c, d, e, 30); R2(e, a, b, c, d, 31); R2(d, e, a, b, c, 32);
    R2(c, d, e, a, b, 33); R2(b, c, d, e, a, 34);
    R2(a, b, c, d, e, 35); R2(e, a, b, c, d, 36); R2(d, e, a, b, c, 37);
    R2(c, d, e, a, b, 38); R2(b, c, d, e, a, 39);
    R3(a, b, c, d, e, 40); R3(e, a, b, c, d, 41); R3(d, e, a, b, c, 42);
    R3(c, d, e, a, b, 43); R3(b, c, d, e, a, 44);
    R3(a, b, c, d, e, 45); R3(e, a, b, c, d, 46); R3(d, e, a, b, c, 47);
    R3(c, d, e, a, b, 48); R3(b, c, d, e, a, 49);
    R3(a, b, c, d, e, 50); R3(e, a, b, c, d, 51); R3(d, e, a, b, c, 52);
    R3(c, d, e, a, b, 53); R3(b, c, d, e, a, 54);
    R3(a, b, c, d, e, 55); R3(e, a, b, c, d, 56); R3(d, e, a, b, c, 57);
    R3(c, d, e, a, b, 58); R3(b, c, d, e, a, 59);
    R4(a, b, c, d, e, 60); R4(e, a, b, c, d, 61); R4(d, e, a, b, c, 62);
    R4(c, d, e, a, b, 63); R4(b, c, d, e, a, 64);
    R4(a, b, c, d, e, 65); R4(e, a, b, c, d, 66); R4(d, e, a, b, c, 67);
    R4(c, d, e, a, b, 68); R4(b, c, d, e, a, 69);
    R4(a, b, c, d, e, 70); R4(e, a, b, c, d, 71); R4(d, e, a, b, c, 72);
    R4(c, d, e, a, b, 73); R4(b, c, d, e, a, 74);
    R4(a, b, c, d, e, 75); R4(e, a, b, c, d, 76); R4(d, e, a, b, c, 77);
    R4(c, d, e, a, b, 78); R4(b, c, d, e, a, 79);
#undef R0
#undef R1
#undef R2
#undef R3
#undef R4
#undef SHA1_W
#undef SHA1_W0
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
}

/* OpenSSL's `SHA1_Transform` (its assembly block function), found in the libcrypto Python's
 * _hashlib has loaded (as zlib-ng's CRC is found), else NULL and sha1_block_c does it. Only
 * the state words h0..h4 at the start of its SHA_CTX are read and written. */
typedef struct {
    uint32_t h[5], nl, nh, data[16];
    unsigned int num;
} openssl_sha_ctx;
typedef void (*sha1_transform_fn)(openssl_sha_ctx *, const uint8_t *);
static sha1_transform_fn openssl_sha1 = NULL;
static int sha1_portable = 0; /* set by sha1() for the tests of sha1_block_c */

static void sha1_block(uint32_t h[5], const uint8_t *p) {
    if (openssl_sha1 == NULL || sha1_portable) {
        sha1_block_c(h, p);
        return;
    }
    openssl_sha_ctx c;
    memcpy(c.h, h, sizeof c.h);
    openssl_sha1(&c, p);
    memcpy(h, c.h, sizeof c.h);
}

static const uint32_t sha1_init[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u,
                                      0xC3D2E1F0u};

static void sha1_update(sha1_ctx *c, const uint8_t *p, size_t n) {
    c->total += n;
    if (c->used) {
        size_t take = SHA1_BLOCK - c->used;
        if (take > n) take = n;
        if (take <= 16) /* most fields' values: a loop costs less than the call */
            for (size_t i = 0; i < take; i++) c->buf[c->used + i] = p[i];
        else
            memcpy(c->buf + c->used, p, take);
        c->used += take;
        p += take;
        n -= take;
        if (c->used < SHA1_BLOCK) return;
        sha1_block(c->h, c->buf);
        c->used = 0;
    }
    for (; n >= SHA1_BLOCK; p += SHA1_BLOCK, n -= SHA1_BLOCK) sha1_block(c->h, p);
    if (n) {
        if (n <= 16)
            for (size_t i = 0; i < n; i++) c->buf[i] = p[i];
        else
            memcpy(c->buf, p, n);
        c->used = n;
    }
}

static void sha1_final(sha1_ctx *c, uint8_t out[20]) {
    uint64_t bits = c->total * 8;
    uint8_t tail[SHA1_BLOCK + 8] = {0x80};
    size_t pad = (c->used < 56 ? 56 : 120) - c->used;
    for (int i = 0; i < 8; i++) tail[pad + i] = (uint8_t)(bits >> (56 - 8 * i));
    sha1_update(c, tail, pad + 8);
    for (int i = 0; i < 20; i++) out[i] = (uint8_t)(c->h[i / 4] >> (24 - 8 * (i % 4)));
}

static PyObject *str_signature, *str_unique_key_query; /* interned field names */

/* sha1(data: bytes, portable: bool) -> bytes: SHA-1 of `data` by the block function in use,
 * or by sha1_block_c; for the tests, which hold both to hashlib. */
static PyObject *sha1(PyObject *self, PyObject *args) {
    Py_buffer view;
    int portable;
    if (!PyArg_ParseTuple(args, "y*p", &view, &portable)) return NULL;
    sha1_ctx c = {.total = 0, .used = 0};
    memcpy(c.h, sha1_init, sizeof c.h);
    sha1_portable = portable;
    sha1_update(&c, view.buf, (size_t)view.len);
    uint8_t out[20];
    sha1_final(&c, out);
    sha1_portable = 0;
    PyBuffer_Release(&view);
    return PyBytes_FromStringAndSize((const char *)out, sizeof out);
}

static PyObject *sha1_source(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(openssl_sha1 != NULL ? "openssl" : "c");
}

/* acl_pads(key: bytes) -> bytes: HmacSHA1's two key states for `key` (RFC 2104), opaque. */
static PyObject *acl_pads(PyObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "acl_pads() takes the secret key's bytes");
        return NULL;
    }
    uint8_t key[SHA1_BLOCK] = {0}, block[SHA1_BLOCK];
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    if (n > SHA1_BLOCK) {
        sha1_ctx c = {.total = 0, .used = 0};
        memcpy(c.h, sha1_init, sizeof c.h);
        sha1_update(&c, (const uint8_t *)PyBytes_AS_STRING(arg), (size_t)n);
        sha1_final(&c, key);
    } else {
        memcpy(key, PyBytes_AS_STRING(arg), (size_t)n);
    }
    uint32_t states[10];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < SHA1_BLOCK; i++) block[i] = key[i] ^ (k ? 0x5C : 0x36);
        memcpy(states + 5 * k, sha1_init, sizeof sha1_init);
        sha1_block(states + 5 * k, block);
    }
    return PyBytes_FromStringAndSize((const char *)states, sizeof states);
}

typedef struct {
    PyObject *key, *value;
} acl_item;

static int same_text(PyObject *key, PyObject *name) {
    return key == name || (PyUnicode_GET_LENGTH(key) == PyUnicode_GET_LENGTH(name) &&
                           PyUnicode_Compare(key, name) == 0);
}

static int acl_item_order(const void *x, const void *y) {
    PyObject *a = ((const acl_item *)x)->key, *b = ((const acl_item *)y)->key;
    if (PyUnicode_KIND(a) == PyUnicode_1BYTE_KIND && PyUnicode_KIND(b) == PyUnicode_1BYTE_KIND) {
        Py_ssize_t na = PyUnicode_GET_LENGTH(a), nb = PyUnicode_GET_LENGTH(b);
        int r = memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)(na < nb ? na : nb));
        return r ? r : (na > nb) - (na < nb);
    }
    return PyUnicode_Compare(a, b); /* cannot fail: both are str */
}

/* Hash `text`'s UTF-8 (surrogatepass) into `c`; -1 with an exception set if it is no str. */
static int acl_hash_text(sha1_ctx *c, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "an extFields value is %.100s, not str",
                     Py_TYPE(text)->tp_name);
        return -1;
    }
    if (PyUnicode_IS_ASCII(text)) {
        sha1_update(c, PyUnicode_DATA(text), (size_t)PyUnicode_GET_LENGTH(text));
        return 0;
    }
    PyObject *utf8 = PyUnicode_AsEncodedString(text, "utf-8", "surrogatepass");
    if (utf8 == NULL) return -1;
    sha1_update(c, (const uint8_t *)PyBytes_AS_STRING(utf8), (size_t)PyBytes_GET_SIZE(utf8));
    Py_DECREF(utf8);
    return 0;
}

/* The signature's 28 Base64 characters into `out`; -1 with an exception set on bad input. */
static int acl_sign_into(PyObject *const *args, char out[ACL_SIGNATURE_CHARS]) {
    PyObject *fields = args[0], *body = args[1], *pads = args[2];
    int old = PyObject_IsTrue(args[3]);
    if (old < 0) return -1;
    if (!PyBytes_Check(pads) || PyBytes_GET_SIZE(pads) != ACL_PADS_BYTES) {
        PyErr_SetString(PyExc_ValueError, "pads must be what acl_pads() gives");
        return -1;
    }
    Py_buffer view = {0};
    if (PyObject_GetBuffer(body, &view, PyBUF_SIMPLE) < 0) return -1;
    PyObject *dict = fields;
    Py_INCREF(dict);
    if (!PyDict_Check(dict)) { /* any other mapping: its items in a dict first */
        Py_DECREF(dict);
        dict = PyDict_New();
        if (dict == NULL || PyDict_Merge(dict, fields, 1) < 0) goto fail_dict;
    }
    acl_item stack[ACL_SORT_ON_STACK], *items = stack;
    Py_ssize_t size = PyDict_GET_SIZE(dict), count = 0, pos = 0;
    if (size > ACL_SORT_ON_STACK) {
        items = PyMem_New(acl_item, (size_t)size);
        if (items == NULL) {
            PyErr_NoMemory();
            goto fail_dict;
        }
    }
    PyObject *key, *value;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        if (!PyUnicode_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "an extFields key is not str");
            goto fail;
        }
        if (same_text(key, str_signature)) continue;
        if (old && same_text(key, str_unique_key_query)) continue;
        items[count].key = key;
        items[count].value = value;
        count++;
    }
    if (count > ACL_SORT_ON_STACK) {
        qsort(items, (size_t)count, sizeof *items, acl_item_order);
    } else { /* a request's dozen fields: insertion sort, no calls through a pointer */
        for (Py_ssize_t i = 1; i < count; i++) {
            acl_item item = items[i];
            Py_ssize_t j = i;
            for (; j > 0 && acl_item_order(&items[j - 1], &item) > 0; j--) items[j] = items[j - 1];
            items[j] = item;
        }
    }
    const uint32_t *states = (const uint32_t *)PyBytes_AS_STRING(pads);
    sha1_ctx c = {.total = SHA1_BLOCK, .used = 0};
    memcpy(c.h, states, sizeof c.h);
    for (Py_ssize_t i = 0; i < count; i++)
        if (acl_hash_text(&c, items[i].value) < 0) goto fail;
    sha1_update(&c, view.buf, (size_t)view.len);
    uint8_t digest[21] = {0};
    sha1_final(&c, digest);
    memcpy(c.h, states + 5, sizeof c.h);
    c.total = SHA1_BLOCK;
    c.used = 0;
    sha1_update(&c, digest, 20);
    sha1_final(&c, digest);
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0, o = 0; i < 21; i += 3, o += 4) { /* 20 bytes and a zero: the last '=' below */
        uint32_t v = (uint32_t)digest[i] << 16 | (uint32_t)digest[i + 1] << 8 | digest[i + 2];
        out[o] = b64[v >> 18];
        out[o + 1] = b64[(v >> 12) & 63];
        out[o + 2] = b64[(v >> 6) & 63];
        out[o + 3] = b64[v & 63];
    }
    out[ACL_SIGNATURE_CHARS - 1] = '=';
    if (items != stack) PyMem_Free(items);
    Py_DECREF(dict);
    PyBuffer_Release(&view);
    return 0;
fail:
    if (items != stack) PyMem_Free(items);
fail_dict:
    Py_XDECREF(dict);
    PyBuffer_Release(&view);
    return -1;
}

/* acl_signature(fields, body, pads, old) -> str: acl.signature's Base64 text. */
static PyObject *acl_signature(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "acl_signature(fields, body, pads, old)");
        return NULL;
    }
    char out[ACL_SIGNATURE_CHARS];
    if (acl_sign_into(args, out) < 0) return NULL;
    return PyUnicode_FromStringAndSize(out, ACL_SIGNATURE_CHARS);
}

/* acl_verify(fields, body, pads, old, sent) -> bool: `sent` is the signature, compared in
 * constant time (only its length and whether it is ASCII, neither secret, end it early). */
static PyObject *acl_verify(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyUnicode_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "acl_verify(fields, body, pads, old, sent: str)");
        return NULL;
    }
    char out[ACL_SIGNATURE_CHARS];
    if (acl_sign_into(args, out) < 0) return NULL;
    PyObject *sent = args[4];
    if (!PyUnicode_IS_ASCII(sent) || PyUnicode_GET_LENGTH(sent) != ACL_SIGNATURE_CHARS)
        Py_RETURN_FALSE;
    const uint8_t *s = PyUnicode_DATA(sent);
    volatile uint8_t diff = 0;
    for (int i = 0; i < ACL_SIGNATURE_CHARS; i++) diff |= (uint8_t)(s[i] ^ (uint8_t)out[i]);
    return PyBool_FromLong(diff == 0);
}

static PyObject *crc_source(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(zng_crc32 != NULL ? "zlib-ng" : "tables");
}

static PyMethodDef methods[] = {
    {"encode_records", encode_records, METH_VARARGS, "Encode stored records (see records.py)."},
    {"java_string_hash", java_string_hash, METH_O, "Java's String.hashCode as a signed int."},
    {"measure", measure, METH_VARARGS, "(total stored bytes, largest body) of items."},
    {"verify_record_crc", verify_record_crc, METH_VARARGS, "Body and record CRCs hold."},
    {"decode_buffers", decode_buffers, METH_O, "Stored records into Arrow-layout buffers."},
    {"crc_source", crc_source, METH_NOARGS, "Where CRC-32 comes from: zlib-ng or tables."},
    {"scan_entries", scan_entries, METH_VARARGS, "Choose a read's consume-queue entries."},
    {"split_span", split_span, METH_VARARGS, "A run's records out of its commit-log span."},
    {"record_infos", record_infos, METH_VARARGS, "What dispatch indexes of records in a row."},
    {"index_put", index_put, METH_VARARGS, "Add keys to a mapped key-index file."},
    {"acl_pads", acl_pads, METH_O, "HmacSHA1's key states for a secret key."},
    {"sha1", sha1, METH_VARARGS, "SHA-1 of data (portable: by the C block function)."},
    {"sha1_source", sha1_source, METH_NOARGS, "Where SHA-1's blocks go: openssl or c."},
    {"acl_signature", (PyCFunction)(void (*)(void))acl_signature, METH_FASTCALL,
     "ACL 1.0's request signature (security/acl.py)."},
    {"acl_verify", (PyCFunction)(void (*)(void))acl_verify, METH_FASTCALL,
     "Whether a request's signature is right, compared in constant time."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "accel", NULL, -1, methods};

static void find_zlib_ng(void) {
    PyObject *mod = PyImport_ImportModule("zlib_ng.zlib_ng");
    if (mod == NULL) {
        PyErr_Clear();
        return;
    }
    PyObject *file = PyObject_GetAttrString(mod, "__file__");
    Py_DECREF(mod);
    if (file == NULL || !PyUnicode_Check(file)) {
        Py_XDECREF(file);
        PyErr_Clear();
        return;
    }
    const char *path = PyUnicode_AsUTF8(file);
    void *handle = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (handle != NULL) zng_crc32 = (crc32_fn)dlsym(handle, "zng_crc32");
    Py_DECREF(file);
    PyErr_Clear();
}

static void find_openssl_sha1(void) {
    PyObject *mod = PyImport_ImportModule("_hashlib");
    PyObject *file = mod != NULL ? PyObject_GetAttrString(mod, "__file__") : NULL;
    Py_XDECREF(mod);
    const char *path = file != NULL && PyUnicode_Check(file) ? PyUnicode_AsUTF8(file) : NULL;
    void *handle = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (handle != NULL) { /* searched with its dependencies: the libcrypto it links */
        openssl_sha1 = (sha1_transform_fn)dlsym(handle, "SHA1_Transform");
        uint8_t block[SHA1_BLOCK] = {0x80}; /* SHA-1(""): one padded block */
        uint32_t a[5], b[5];
        memcpy(a, sha1_init, sizeof a);
        memcpy(b, sha1_init, sizeof b);
        if (openssl_sha1 != NULL) sha1_block(a, block);
        sha1_block_c(b, block);
        if (memcmp(a, b, sizeof a) != 0) openssl_sha1 = NULL; /* not the function it should be */
    }
    Py_XDECREF(file);
    PyErr_Clear();
}

PyMODINIT_FUNC PyInit_accel(void) {
    str_body = PyUnicode_InternFromString("body");
    str_properties = PyUnicode_InternFromString("properties");
    str_flag = PyUnicode_InternFromString("flag");
    str_signature = PyUnicode_InternFromString("Signature");
    str_unique_key_query = PyUnicode_InternFromString("_UNIQUE_KEY_QUERY");
    if (str_body == NULL || str_properties == NULL || str_flag == NULL || str_signature == NULL ||
        str_unique_key_query == NULL)
        return NULL;
    crc_table_init();
    find_zlib_ng();
    find_openssl_sha1();
    return PyModule_Create(&module);
}
