#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/status.h"

const char *fm_path_show(fm_path_buf *b, const char *path) {
    if (!path) return "(null)";
    const size_t n = strlen(path);
    if (n <= FM_PATH_SHOWN) return path;
    memcpy(b->s, "...", 3);
    memcpy(b->s + 3, path + n - FM_PATH_SHOWN, FM_PATH_SHOWN + 1);
    return b->s;
}

const char *fm_file_kind(unsigned mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISREG(mode)) return "a regular file";
    return "not a file";
}

fm_status fm_open_regular(const char *path, const char *what, int *fd, bool *missing, fm_error *err) {
    fm_path_buf pb;
    *fd = -1;
    if (missing) *missing = false;
    /* the type first: opening a FIFO without a writer waits forever, opening a device may act on it */
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        if (S_ISDIR(sb.st_mode))
            return fm_fail(err, FM_ERR_IO, "%s: is a directory, expected %s", fm_path_show(&pb, path), what);
        return fm_fail(err, FM_ERR_IO, "%s: not a regular file (%s), expected %s", fm_path_show(&pb, path),
                       fm_file_kind(sb.st_mode), what);
    }
    /* O_NONBLOCK too, for a FIFO put there after the stat; the type is checked again on the open file */
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) {
        const int e = errno;
        if (e == ENOENT && missing) {
            *missing = true;
            return FM_OK;
        }
        return fm_fail(err, FM_ERR_IO, "%s: cannot open %s: %s", fm_path_show(&pb, path), what, strerror(e));
    }
    if (fstat(f, &sb) != 0) {
        const int e = errno;
        close(f);
        return fm_fail(err, FM_ERR_IO, "%s: cannot stat %s: %s", fm_path_show(&pb, path), what, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(f);
        if (S_ISDIR(sb.st_mode))
            return fm_fail(err, FM_ERR_IO, "%s: is a directory, expected %s", fm_path_show(&pb, path), what);
        return fm_fail(err, FM_ERR_IO, "%s: not a regular file (%s), expected %s", fm_path_show(&pb, path),
                       fm_file_kind(sb.st_mode), what);
    }
    const int fl = fcntl(f, F_GETFL);
    if (fl >= 0) fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
    *fd = f;
    return FM_OK;
}

fm_status fm_read_regular(const char *path, const char *what, size_t max_bytes, char **data, size_t *len,
                          fm_error *err) {
    fm_path_buf pb;
    *data = NULL;
    *len = 0;
    int fd = -1;
    fm_status st = fm_open_regular(path, what, &fd, NULL, err);
    if (st) return st;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size > max_bytes) {
        close(fd);
        return fm_fail(err, FM_ERR_FORMAT, "%s: unreadable or larger than %zu bytes (%s)", fm_path_show(&pb, path),
                       max_bytes, what);
    }
    const size_t n = (size_t)sb.st_size;
    char *buf = fm_malloc(n + 1, err, what);
    if (!buf) {
        close(fd);
        return FM_ERR_NOMEM;
    }
    size_t got = 0;
    while (got < n) {
        const ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            const int e = errno;
            free(buf);
            close(fd);
            return fm_fail(err, FM_ERR_IO, "%s: read failed after %zu of %zu bytes: %s", fm_path_show(&pb, path), got,
                           n, r < 0 ? strerror(e) : "unexpected end of file");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return FM_OK;
}

fm_status fm_check_output_path(const char *path, fm_error *err) {
    fm_path_buf pb;
    if (!path || !*path) return fm_fail(err, FM_ERR_USAGE, "an output path is empty");
    struct stat sb;
    if (stat(path, &sb) != 0) return FM_OK; /* absent (or unreachable: the write says why) */
    if (S_ISREG(sb.st_mode)) return FM_OK;
    if (S_ISDIR(sb.st_mode))
        return fm_fail(err, FM_ERR_IO, "%s: is a directory, expected an output file name", fm_path_show(&pb, path));
    return fm_fail(err, FM_ERR_IO,
                   "%s: not a regular file (%s); an output must be absent or a regular file, which "
                   "is replaced",
                   fm_path_show(&pb, path), fm_file_kind(sb.st_mode));
}
