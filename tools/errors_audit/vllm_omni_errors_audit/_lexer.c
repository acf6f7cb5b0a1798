/* The audit's logical-line table, in C (issue 16: the cold audit's speed).
 *
 * ``logical_lines(text)`` returns what ``skeleton._logical_lines`` builds
 * from CPython's tokenizer - for each logical line its first and last
 * physical line, its block depth, its first and second token and whether it
 * ends with ``:`` - without making a Python object per token (CPython's
 * ``TokenizerIter`` makes seven, and decodes each token's line twice for
 * its columns: most of a cold audit's tokenizing time).
 *
 * It is a fast path, not a second tokenizer: on anything it does not
 * follow exactly as CPython's tokenizer does (a tab or form feed in an
 * indentation, a byte outside ASCII outside strings and comments, a number
 * literal that is not plainly valid, a character that is not Python, an
 * unterminated string or bracket, a bad dedent), it returns None and the
 * caller tokenizes with CPython. Where it returns a table, the table equals
 * CPython's (tests/errors/test_audit_lexer.py compares both on every file
 * of two real trees and on generated code).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define MAX_INDENT 100 /* CPython's MAXINDENT */
#define MAX_LEVEL 200  /* CPython's MAXLEVEL (bracket nesting) */

typedef struct {
    const char *s; /* UTF-8 text */
    Py_ssize_t n;
    Py_ssize_t i;  /* current offset */
    long line;     /* current 1-based line */
} Lexer;

typedef struct {
    Py_ssize_t start, end; /* byte span */
} Span;

/* One logical line. */
typedef struct {
    long first, last; /* physical lines */
    int depth;        /* block depth */
    int column;       /* indentation of its first line */
    int count;        /* tokens (2 at most are kept) */
    int header;       /* ends with ``:`` */
    Span tokens[2];
} Row;

typedef struct {
    Row *rows;
    Py_ssize_t size, capacity;
} Rows;

static Row *new_row(Rows *rows) {
    if (rows->size == rows->capacity) {
        Py_ssize_t capacity = rows->capacity ? rows->capacity * 2 : 256;
        Row *grown = PyMem_Realloc(rows->rows, (size_t)capacity * sizeof(Row));
        if (grown == NULL)
            return NULL;
        rows->rows = grown;
        rows->capacity = capacity;
    }
    return &rows->rows[rows->size++];
}

static int is_name_start(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static int is_name_char(unsigned char c) {
    return is_name_start(c) || (c >= '0' && c <= '9');
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* ``digits`` for one base: digits with single underscores between them. */
static int digit_in_base(unsigned char c, int base) {
    switch (base) {
    case 16:
        return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    case 8:
        return c >= '0' && c <= '7';
    case 2:
        return c == '0' || c == '1';
    default:
        return is_digit(c);
    }
}

/* Consume ``d(_?d)*`` at ``*i``; the count of digits read, -1 on a bad
 * underscore. */
static Py_ssize_t digit_part(const char *s, Py_ssize_t n, Py_ssize_t *i, int base) {
    Py_ssize_t count = 0;
    while (*i < n) {
        unsigned char c = (unsigned char)s[*i];
        if (digit_in_base(c, base)) {
            count++;
            (*i)++;
        } else if (c == '_') {
            if (count == 0 || *i + 1 >= n ||
                !digit_in_base((unsigned char)s[*i + 1], base))
                return -1;
            (*i)++;
        } else {
            break;
        }
    }
    return count;
}

/* A number literal at ``lx->i`` (a digit, or ``.`` then a digit): 0 when it
 * is plainly valid and not followed by a name character, else -1. */
static int lex_number(Lexer *lx) {
    const char *s = lx->s;
    Py_ssize_t n = lx->n, i = lx->i;
    int is_float = 0;
    if (s[i] == '0' && i + 1 < n &&
        (s[i + 1] == 'x' || s[i + 1] == 'X' || s[i + 1] == 'o' || s[i + 1] == 'O' ||
         s[i + 1] == 'b' || s[i + 1] == 'B')) {
        char k = s[i + 1];
        int base = (k == 'x' || k == 'X') ? 16 : (k == 'o' || k == 'O') ? 8 : 2;
        i += 2;
        if (i < n && s[i] == '_')
            i++;
        if (digit_part(s, n, &i, base) <= 0)
            return -1;
    } else {
        Py_ssize_t first = i;
        if (s[i] != '.') {
            if (digit_part(s, n, &i, 10) <= 0)
                return -1;
        }
        if (i < n && s[i] == '.') {
            is_float = 1;
            i++;
            if (i < n && is_digit((unsigned char)s[i])) {
                if (digit_part(s, n, &i, 10) < 0)
                    return -1;
            } else if (s[first] == '.') {
                return -1;
            }
        }
        if (i < n && (s[i] == 'e' || s[i] == 'E')) {
            Py_ssize_t j = i + 1;
            if (j < n && (s[j] == '+' || s[j] == '-'))
                j++;
            if (j >= n || !is_digit((unsigned char)s[j]))
                return -1;
            i = j;
            if (digit_part(s, n, &i, 10) <= 0)
                return -1;
            is_float = 1;
        }
        if (i < n && (s[i] == 'j' || s[i] == 'J')) {
            i++;
            is_float = 1;
        }
        if (!is_float) {
            /* ``0777`` is an error; ``0``, ``00`` and ``0_0`` are not. */
            if (s[first] == '0') {
                for (Py_ssize_t k = first; k < i; k++)
                    if (s[k] != '0' && s[k] != '_')
                        return -1;
            }
        }
    }
    if (i < n && (is_name_char((unsigned char)s[i]) || s[i] == '.' ||
                  (unsigned char)s[i] >= 0x80))
        return -1;
    lx->i = i;
    return 0;
}

/* A string literal whose opening quote is at ``lx->i``: 0 at its end, -1
 * when it does not end (a newline in a one-quote string, or the end of the
 * text). */
static int lex_string(Lexer *lx) {
    const char *s = lx->s;
    Py_ssize_t n = lx->n, i = lx->i;
    char q = s[i];
    int triple = i + 2 < n && s[i + 1] == q && s[i + 2] == q;
    i += triple ? 3 : 1;
    while (i < n) {
        char c = s[i];
        if (c == '\\') {
            if (i + 1 < n && s[i + 1] == '\n')
                lx->line++;
            i += 2;
            continue;
        }
        if (c == '\n') {
            if (!triple)
                return -1;
            lx->line++;
        } else if (c == q) {
            if (!triple) {
                lx->i = i + 1;
                return 0;
            }
            if (i + 2 < n && s[i + 1] == q && s[i + 2] == q) {
                lx->i = i + 3;
                return 0;
            }
        }
        i++;
    }
    return -1;
}

static int is_string_prefix(const char *s, Py_ssize_t len) {
    char a, b;
    if (len == 1) {
        a = (char)(s[0] | 0x20);
        return a == 'r' || a == 'u' || a == 'b' || a == 'f';
    }
    if (len == 2) {
        a = (char)(s[0] | 0x20);
        b = (char)(s[1] | 0x20);
        return (a == 'r' && (b == 'b' || b == 'f')) ||
               ((a == 'b' || a == 'f') && b == 'r');
    }
    return 0;
}

/* An operator at ``lx->i``: its length, 0 when the character is not one. */
static Py_ssize_t operator_length(const char *s, Py_ssize_t n, Py_ssize_t i) {
    static const char *three[] = {"**=", "...", "//=", "<<=", ">>=", NULL};
    static const char *two[] = {"!=", "%=", "&=", "**", "*=", "+=", "-=", "->",
                                "//", "/=", ":=", "<<", "<=", "<>", "==", ">=",
                                ">>", "@=", "^=", "|=", NULL};
    if (i + 2 < n)
        for (int k = 0; three[k]; k++)
            if (s[i] == three[k][0] && s[i + 1] == three[k][1] &&
                s[i + 2] == three[k][2])
                return 3;
    if (i + 1 < n)
        for (int k = 0; two[k]; k++)
            if (s[i] == two[k][0] && s[i + 1] == two[k][1])
                return 2;
    switch (s[i]) {
    case '(': case ')': case '[': case ']': case '{': case '}': case ':':
    case ',': case ';': case '+': case '-': case '*': case '/': case '|':
    case '&': case '<': case '>': case '=': case '.': case '%': case '~':
    case '^': case '@':
        return 1;
    default:
        return 0;
    }
}

/* One token of a row: a short string made once per distinct spelling. */
static PyObject *token_text(PyObject *cache, const char *s, Span span) {
    PyObject *key = PyUnicode_DecodeUTF8(s + span.start, span.end - span.start, NULL);
    if (key == NULL)
        return NULL;
    if (span.end - span.start > 32)
        return key;
    PyObject *known = PyDict_SetDefault(cache, key, key);
    Py_XINCREF(known);
    Py_DECREF(key);
    return known;
}

/* -1: out of memory; 0: done; 1: not followed, return None. */
static int lex(Lexer *lx, Rows *rows) {
    const char *s = lx->s;
    Py_ssize_t n = lx->n;
    int indents[MAX_INDENT + 1];
    int top = 0;
    char brackets[MAX_LEVEL];
    int level = 0;
    indents[0] = 0;

    while (lx->i < n) {
        /* The start of a physical line outside any statement. */
        Py_ssize_t i = lx->i;
        int column = 0, tabs = 0;
        while (i < n && (s[i] == ' ' || s[i] == '\t')) {
            tabs += s[i] == '\t';
            column++;
            i++;
        }
        if (i >= n)
            break;
        if (s[i] == '\f' || s[i] == '\v')
            return 1;
        if (s[i] == '#') {
            while (i < n && s[i] != '\n')
                i++;
        }
        if (i >= n)
            break;
        if (s[i] == '\n') {
            lx->i = i + 1;
            lx->line++;
            continue;
        }
        /* A statement starts here; CPython's rules for tabs in its
         * indentation (columns at tab stops of 8 and of 1) are not followed
         * here. */
        if (s[i] == '\\' || tabs)
            return 1;
        if (column > indents[top]) {
            if (top >= MAX_INDENT)
                return 1;
            indents[++top] = column;
        } else {
            while (top > 0 && column < indents[top])
                top--;
            if (column != indents[top])
                return 1;
        }
        lx->i = i;
        long first_line = lx->line;
        Span tokens[2] = {{0, 0}, {0, 0}};
        int count = 0;
        Span last = {0, 0};
        for (;;) {
            i = lx->i;
            if (i >= n) {
                if (level > 0)
                    return 1;
                break;
            }
            unsigned char c = (unsigned char)s[i];
            if (c == ' ' || c == '\t') {
                lx->i++;
                continue;
            }
            if (c == '\n') {
                if (level == 0)
                    break;
                lx->line++;
                lx->i++;
                continue;
            }
            if (c == '#') {
                while (lx->i < n && s[lx->i] != '\n')
                    lx->i++;
                continue;
            }
            if (c == '\\') {
                /* A line continuation; the text may not end right after
                 * it (CPython: unexpected EOF). */
                if (i + 2 < n && s[i + 1] == '\n') {
                    lx->line++;
                    lx->i += 2;
                    continue;
                }
                return 1;
            }
            Span token = {i, i};
            if (is_name_start(c)) {
                Py_ssize_t j = i + 1;
                while (j < n && is_name_char((unsigned char)s[j]))
                    j++;
                if (j < n && (unsigned char)s[j] >= 0x80)
                    return 1;
                if (j < n && (s[j] == '\'' || s[j] == '"')) {
                    if (!is_string_prefix(s + i, j - i))
                        return 1;
                    lx->i = j;
                    if (lex_string(lx) < 0)
                        return 1;
                } else {
                    lx->i = j;
                }
            } else if (c == '\'' || c == '"') {
                if (lex_string(lx) < 0)
                    return 1;
            } else if (is_digit(c) || (c == '.' && i + 1 < n && is_digit((unsigned char)s[i + 1]))) {
                if (lex_number(lx) < 0)
                    return 1;
            } else {
                Py_ssize_t length = operator_length(s, n, i);
                if (length == 0)
                    return 1; /* not Python: a byte outside ASCII, ``$``, ``?``, ... */
                if (length == 1) {
                    if (c == '(' || c == '[' || c == '{') {
                        if (level >= MAX_LEVEL)
                            return 1;
                        brackets[level++] = (char)c;
                    } else if (c == ')' || c == ']' || c == '}') {
                        char opening = c == ')' ? '(' : c == ']' ? '[' : '{';
                        if (level == 0 || brackets[level - 1] != opening)
                            return 1;
                        level--;
                    }
                }
                lx->i = i + length;
            }
            token.end = lx->i;
            if (count < 2)
                tokens[count] = token;
            count++;
            last = token;
        }
        /* The logical line ends at this line (its newline, or the text's
         * end). */
        Row *row = new_row(rows);
        if (row == NULL)
            return -1;
        row->first = first_line;
        row->last = lx->line;
        row->depth = top;
        row->column = column;
        row->count = count;
        row->header = last.end - last.start == 1 && s[last.start] == ':';
        row->tokens[0] = tokens[0];
        row->tokens[1] = tokens[1];
        if (lx->i < n) {
            lx->i++;
            lx->line++;
        }
    }
    return 0;
}

static int is_def(const char *s, const Row *row) {
    const Span *t = &row->tokens[0];
    if (t->end - t->start == 3 && memcmp(s + t->start, "def", 3) == 0)
        return 1;
    if (t->end - t->start == 5 && memcmp(s + t->start, "async", 5) == 0 &&
        row->count > 1) {
        const Span *u = &row->tokens[1];
        return u->end - u->start == 3 && memcmp(s + u->start, "def", 3) == 0;
    }
    return 0;
}

/* Whether one of the sorted ``barriers`` lies in [first, last]. */
static int has_barrier(const long *barriers, Py_ssize_t count, long first, long last) {
    Py_ssize_t low = 0, high = count;
    while (low < high) {
        Py_ssize_t middle = (low + high) / 2;
        if (barriers[middle] < first)
            low = middle + 1;
        else
            high = middle;
    }
    return low < count && barriers[low] <= last;
}

static int append_long(PyObject *list, long value) {
    PyObject *item = PyLong_FromLong(value);
    if (item == NULL)
        return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

static int append_token(PyObject *list, PyObject *cache, const char *s, Span span) {
    PyObject *item = token_text(cache, s, span);
    if (item == NULL)
        return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

/* The columns of the rows, the body of every function with no barrier
 * line in it replaced by one ``pass`` row; the cuts as (first line, last
 * line, indentation). */
static PyObject *build(const char *s, Rows *rows, const long *barriers,
                       Py_ssize_t barrier_count, int cut) {
    PyObject *columns[7] = {NULL};
    PyObject *cache = PyDict_New();
    PyObject *pass = PyUnicode_InternFromString("pass");
    PyObject *result = NULL;
    if (cache == NULL || pass == NULL)
        goto done;
    for (int k = 0; k < 7; k++) {
        columns[k] = PyList_New(0);
        if (columns[k] == NULL)
            goto done;
    }
    for (Py_ssize_t index = 0; index < rows->size; index++) {
        const Row *row = &rows->rows[index];
        if (append_long(columns[0], row->first) < 0 ||
            append_long(columns[1], row->last) < 0 ||
            append_long(columns[2], row->depth) < 0 ||
            append_token(columns[3], cache, s, row->tokens[0]) < 0)
            goto done;
        if (row->count > 1) {
            if (append_token(columns[4], cache, s, row->tokens[1]) < 0)
                goto done;
        } else if (PyList_Append(columns[4], Py_None) < 0) {
            goto done;
        }
        if (PyList_Append(columns[5], row->header ? Py_True : Py_False) < 0)
            goto done;
        if (!cut || !row->header || index + 1 >= rows->size ||
            rows->rows[index + 1].depth <= row->depth || !is_def(s, row))
            continue;
        /* A function with a block: its body is every deeper row after it. */
        Py_ssize_t end = index + 1;
        while (end < rows->size && rows->rows[end].depth > row->depth)
            end++;
        const Row *body = &rows->rows[index + 1];
        long last = rows->rows[end - 1].last;
        if (has_barrier(barriers, barrier_count, body->first, last))
            continue;
        PyObject *where = Py_BuildValue("(lli)", body->first, last, body->column);
        if (where == NULL)
            goto done;
        int rc = PyList_Append(columns[6], where);
        Py_DECREF(where);
        if (rc < 0 || append_long(columns[0], body->first) < 0 ||
            append_long(columns[1], body->first) < 0 ||
            append_long(columns[2], body->depth) < 0 ||
            PyList_Append(columns[3], pass) < 0 || PyList_Append(columns[4], Py_None) < 0 ||
            PyList_Append(columns[5], Py_False) < 0)
            goto done;
        index = end - 1;
    }
    result = PyTuple_New(7);
    if (result == NULL)
        goto done;
    for (int k = 0; k < 7; k++) {
        PyTuple_SET_ITEM(result, k, columns[k]);
        columns[k] = NULL;
    }
done:
    for (int k = 0; k < 7; k++)
        Py_XDECREF(columns[k]);
    Py_XDECREF(cache);
    Py_XDECREF(pass);
    return result;
}

static PyObject *logical_lines(PyObject *Py_UNUSED(module), PyObject *const *args,
                               Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "logical_lines(text, barriers=None) takes a str and a list");
        return NULL;
    }
    PyObject *barrier_list = nargs == 2 && args[1] != Py_None ? args[1] : NULL;
    if (barrier_list != NULL && !PyList_Check(barrier_list)) {
        PyErr_SetString(PyExc_TypeError, "barriers must be a sorted list of ints");
        return NULL;
    }
    Py_ssize_t size;
    const char *data = PyUnicode_AsUTF8AndSize(args[0], &size);
    if (data == NULL) {
        /* Lone surrogates: not UTF-8, leave it to CPython's tokenizer. */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_ssize_t barrier_count = barrier_list ? PyList_GET_SIZE(barrier_list) : 0;
    long *barriers = PyMem_Malloc((size_t)(barrier_count + 1) * sizeof(long));
    if (barriers == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t k = 0; k < barrier_count; k++) {
        barriers[k] = PyLong_AsLong(PyList_GET_ITEM(barrier_list, k));
        if (barriers[k] == -1 && PyErr_Occurred()) {
            PyMem_Free(barriers);
            return NULL;
        }
    }
    /* CPython reads ``\r`` as a line break, in strings and comments too, and
     * stops at a NUL byte: such texts are the tokenizer's. */
    if (memchr(data, '\r', (size_t)size) != NULL || strlen(data) != (size_t)size) {
        PyMem_Free(barriers);
        Py_RETURN_NONE;
    }
    Lexer lx = {data, size, 0, 1};
    Rows rows = {NULL, 0, 0};
    PyObject *result = NULL;
    int rc = lex(&lx, &rows);
    if (rc < 0)
        PyErr_NoMemory();
    else if (rc > 0)
        result = Py_NewRef(Py_None);
    else
        result = build(data, &rows, barriers, barrier_count, barrier_list != NULL);
    PyMem_Free(rows.rows);
    PyMem_Free(barriers);
    return result;
}

/* ``needle_lines(text, groups)``: for each group of needles (ASCII
 * strings), the sorted 1-based numbers of the lines on which one of them
 * occurs; and the set of the needles that occur. One pass over the text
 * (a first-byte table, then a compare), where ``str.find`` loops make one
 * pass per needle and a Python step per occurrence. */
#define MAX_NEEDLES 256

static PyObject *needle_lines(PyObject *Py_UNUSED(module), PyObject *const *args,
                              Py_ssize_t nargs) {
    if (nargs != 2 || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "needle_lines(text, groups) takes a str or bytes and a tuple");
        return NULL;
    }
    Py_ssize_t size;
    const char *data;
    if (PyUnicode_Check(args[0])) {
        data = PyUnicode_AsUTF8AndSize(args[0], &size);
        if (data == NULL)
            return NULL;
    } else if (PyBytes_Check(args[0])) {
        data = PyBytes_AS_STRING(args[0]);
        size = PyBytes_GET_SIZE(args[0]);
    } else {
        PyErr_SetString(PyExc_TypeError, "needle_lines() takes a str or bytes");
        return NULL;
    }
    PyObject *groups = args[1];
    Py_ssize_t group_count = PyTuple_GET_SIZE(groups);
    const char *needles[MAX_NEEDLES];
    Py_ssize_t lengths[MAX_NEEDLES];
    PyObject *objects[MAX_NEEDLES];
    int owner[MAX_NEEDLES];
    int next[MAX_NEEDLES];
    int first[256];
    char found[MAX_NEEDLES];
    int count = 0;
    for (int k = 0; k < 256; k++)
        first[k] = -1;
    for (Py_ssize_t g = 0; g < group_count; g++) {
        PyObject *group = PyTuple_GET_ITEM(groups, g);
        if (!PyTuple_Check(group)) {
            PyErr_SetString(PyExc_TypeError, "each group is a tuple of str");
            return NULL;
        }
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(group); k++) {
            PyObject *needle = PyTuple_GET_ITEM(group, k);
            Py_ssize_t length;
            const char *text = PyUnicode_Check(needle)
                                   ? PyUnicode_AsUTF8AndSize(needle, &length)
                                   : NULL;
            if (text == NULL || length == 0 || count >= MAX_NEEDLES) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError,
                                    "needles are non-empty str, 256 at most");
                return NULL;
            }
            needles[count] = text;
            lengths[count] = length;
            objects[count] = needle;
            owner[count] = (int)g;
            found[count] = 0;
            /* Appended at the end of its byte's chain: search order is the
             * given order. */
            next[count] = -1;
            int *link = &first[(unsigned char)text[0]];
            while (*link >= 0)
                link = &next[*link];
            *link = count;
            count++;
        }
    }
    PyObject *lists = PyTuple_New(group_count);
    if (lists == NULL)
        return NULL;
    long *latest = PyMem_Calloc((size_t)group_count + 1, sizeof(long));
    if (latest == NULL) {
        Py_DECREF(lists);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t g = 0; g < group_count; g++) {
        PyObject *list = PyList_New(0);
        if (list == NULL)
            goto fail;
        PyTuple_SET_ITEM(lists, g, list);
    }
    /* Which (first, second) byte pairs start a needle (any second byte for a
     * one-byte needle): most offsets are passed over with one lookup. */
    unsigned char pairs[256][32];
    memset(pairs, 0, sizeof(pairs));
    for (int k = 0; k < count; k++) {
        unsigned char a = (unsigned char)needles[k][0];
        if (lengths[k] == 1) {
            memset(pairs[a], 0xff, sizeof(pairs[a]));
        } else {
            unsigned char b = (unsigned char)needles[k][1];
            pairs[a][b >> 3] |= (unsigned char)(1u << (b & 7));
        }
    }
    long line = 1;
    for (Py_ssize_t i = 0; i < size; i++) {
        unsigned char c = (unsigned char)data[i];
        if (c == '\n') {
            line++;
            continue;
        }
        /* Both buffers end with a NUL byte: data[size] can be read. */
        unsigned char d = (unsigned char)data[i + 1];
        if (!(pairs[c][d >> 3] & (1u << (d & 7))))
            continue;
        for (int k = first[c]; k >= 0; k = next[k]) {
            if (lengths[k] > size - i || memcmp(data + i, needles[k], (size_t)lengths[k]) != 0)
                continue;
            found[k] = 1;
            int g = owner[k];
            if (latest[g] != line) {
                latest[g] = line;
                PyObject *number = PyLong_FromLong(line);
                if (number == NULL)
                    goto fail;
                int rc = PyList_Append(PyTuple_GET_ITEM(lists, g), number);
                Py_DECREF(number);
                if (rc < 0)
                    goto fail;
            }
        }
    }
    PyMem_Free(latest);
    latest = NULL;
    PyObject *present = PySet_New(NULL);
    if (present == NULL)
        goto fail;
    for (int k = 0; k < count; k++)
        if (found[k] && PySet_Add(present, objects[k]) < 0) {
            Py_DECREF(present);
            goto fail;
        }
    PyObject *result = PyTuple_Pack(2, lists, present);
    Py_DECREF(lists);
    Py_DECREF(present);
    return result;
fail:
    PyMem_Free(latest);
    Py_DECREF(lists);
    return NULL;
}

/* ``replaceable_runs(first_line, last_line, depth, first_token, header,
 * kept)``: what ``skeleton._replaceable_runs`` yields, as a list of (first
 * line, last line), from the same parallel lists; that function is the
 * specification (tests compare both on both real trees). */
static int token_is(PyObject *token, const char *text) {
    return PyUnicode_Check(token) && PyUnicode_CompareWithASCIIString(token, text) == 0;
}

static int is_clause(PyObject *token) {
    return token_is(token, "elif") || token_is(token, "else") ||
           token_is(token, "except") || token_is(token, "finally") ||
           token_is(token, "case");
}

static PyObject *replaceable_runs(PyObject *Py_UNUSED(module), PyObject *const *args,
                                  Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "replaceable_runs() takes 6 lists");
        return NULL;
    }
    for (int k = 0; k < 6; k++) {
        if (!PyList_Check(args[k]) ||
            PyList_GET_SIZE(args[k]) != PyList_GET_SIZE(args[0])) {
            PyErr_SetString(PyExc_TypeError,
                            "replaceable_runs() takes 6 lists of one length");
            return NULL;
        }
    }
    PyObject *first_line = args[0], *last_line = args[1], *depth_list = args[2];
    PyObject *tokens = args[3], *header_list = args[4], *kept_list = args[5];
    Py_ssize_t count = PyList_GET_SIZE(first_line);
    /* Per row: depth, and flags (1 kept, 2 starts a statement, 4 a header
     * that is not ``match``). */
    long *depth = PyMem_Malloc((size_t)(count + 1) * sizeof(long));
    unsigned char *flags = PyMem_Malloc((size_t)count + 1);
    Py_ssize_t *next_kept = PyMem_Malloc((size_t)(count + 1) * sizeof(Py_ssize_t));
    PyObject *result = NULL;
    if (depth == NULL || flags == NULL || next_kept == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        depth[i] = PyLong_AsLong(PyList_GET_ITEM(depth_list, i));
        if (depth[i] == -1 && PyErr_Occurred())
            goto done;
        PyObject *token = PyList_GET_ITEM(tokens, i);
        int kept = PyObject_IsTrue(PyList_GET_ITEM(kept_list, i));
        int header = PyObject_IsTrue(PyList_GET_ITEM(header_list, i));
        if (kept < 0 || header < 0)
            goto done;
        int starts = !is_clause(token) &&
                     !(i > 0 && token_is(PyList_GET_ITEM(tokens, i - 1), "@") &&
                       depth[i - 1] == depth[i]);
        flags[i] = (unsigned char)(kept | (starts << 1) |
                                   ((header && !token_is(token, "match")) << 2));
    }
    next_kept[count] = count;
    for (Py_ssize_t i = count - 1; i >= 0; i--)
        next_kept[i] = (flags[i] & 1) ? i : next_kept[i + 1];
    result = PyList_New(0);
    if (result == NULL)
        goto done;
    Py_ssize_t index = 0;
    while (index < count) {
        long level = depth[index];
        Py_ssize_t first = -1, last = -1;
        Py_ssize_t next = index + 1;
        if ((flags[index] & 2) && !(flags[index] & 1)) {
            Py_ssize_t boundary = index, probe = index + 1;
            int ended = 1;
            while (probe < count && depth[probe] >= level) {
                if (depth[probe] == level && (flags[probe] & 2))
                    boundary = probe;
                if (flags[probe] & 1) {
                    ended = 0;
                    break;
                }
                probe++;
            }
            if (ended)
                boundary = probe; /* the block (or the text) ends here */
            if (boundary > index) {
                first = index;
                last = boundary - 1;
                next = boundary;
            }
        }
        if (first < 0 && (flags[index] & 4)) {
            Py_ssize_t end = index + 1;
            while (end < count && depth[end] > level)
                end++;
            if (end > index + 1 && next_kept[index + 1] >= end) {
                first = index + 1;
                last = end - 1;
                next = end;
            }
        }
        if (first >= 0) {
            PyObject *run = PyTuple_Pack(2, PyList_GET_ITEM(first_line, first),
                                         PyList_GET_ITEM(last_line, last));
            if (run == NULL || PyList_Append(result, run) < 0) {
                Py_XDECREF(run);
                Py_CLEAR(result);
                goto done;
            }
            Py_DECREF(run);
        }
        index = next;
    }
done:
    PyMem_Free(depth);
    PyMem_Free(flags);
    PyMem_Free(next_kept);
    return result;
}

static PyMethodDef methods[] = {
    {"logical_lines", (PyCFunction)(void (*)(void))logical_lines, METH_FASTCALL,
     "logical_lines(text, barriers=None) -> (first lines, last lines, depths, "
     "first tokens, second tokens, headers, cuts), or None where CPython's "
     "tokenizer must decide. With ``barriers`` (sorted line numbers), the "
     "body of each function with none of them is one ``pass`` row, and "
     "``cuts`` lists (first line, last line, indentation) of each."},
    {"replaceable_runs", (PyCFunction)(void (*)(void))replaceable_runs, METH_FASTCALL,
     "replaceable_runs(first_line, last_line, depth, first_token, header, kept) "
     "-> [(first line, last line)]: skeleton._replaceable_runs in C."},
    {"needle_lines", (PyCFunction)(void (*)(void))needle_lines, METH_FASTCALL,
     "needle_lines(text, groups) -> (per group the sorted numbers of the "
     "lines holding one of its needles, the set of needles found)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_lexer",
    "The audit's logical-line table in C; see logical_lines.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__lexer(void) {
    PyObject *self = PyModule_Create(&module);
    if (self != NULL && PyModule_AddIntConstant(self, "MAX_NEEDLES", MAX_NEEDLES) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return self;
}
