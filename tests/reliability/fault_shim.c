/* An LD_PRELOAD shim that makes file writes fail, stall or get interrupted on cue, so the tests
 * can check what attnres does when the disk fills, the device errs or a signal arrives in the
 * middle of writing a file (docs/reliability.md). It wraps the libc calls attnres's writers make
 * (util/atomic_file: fopen, fwrite, fflush, fsync, rename) and is configured by the environment:
 *
 *   ATTNRES_FAULT="op=OP,path=TEXT[,nth=N][,errno=ENOSPC|EIO][,signal=SIGINT|SIGTERM][,count=K][,delay_ms=D]"
 *     op=write   fwrite/fflush to the N-th file opened for writing whose path contains TEXT fail
 *                with errno; or, with signal=, the first fwrite to it raises the signal K times
 *                (then writes normally); or, with delay_ms=, every fwrite to it first sleeps D ms
 *                (nth=0: to every such file)
 *     op=fsync   the N-th fsync of a file whose path contains TEXT fails with errno
 *     op=rename  the N-th rename whose target path contains TEXT fails with errno
 *   ATTNRES_FAULT_TRACE=FILE   appends "fsync PATH" and "rename FROM TO" lines for every call
 *
 * N defaults to 1 and counts within one process image. Test-only code: never linked into
 * attnres. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum op { OP_NONE, OP_WRITE, OP_FSYNC, OP_RENAME };

static struct {
  int parsed;
  enum op op;
  char path[256];
  long nth;
  int err;
  int sig;
  long count;
  long delay_ms;
  long seen;          /* matching opens (write) or calls (fsync, rename) so far */
  FILE* doomed;       /* op=write: the stream whose writes misbehave */
  int raised;
} rule;

static void parse_rule(void) {
  if (rule.parsed) return;
  rule.parsed = 1;
  rule.nth = 1;
  rule.count = 1;
  rule.err = EIO;
  const char* spec = getenv("ATTNRES_FAULT");
  if (spec == NULL) return;
  char buf[512];
  snprintf(buf, sizeof buf, "%s", spec);
  for (char* save = NULL, *kv = strtok_r(buf, ",", &save); kv != NULL; kv = strtok_r(NULL, ",", &save)) {
    char* eq = strchr(kv, '=');
    if (eq == NULL) continue;
    *eq = '\0';
    const char* key = kv;
    const char* value = eq + 1;
    if (strcmp(key, "op") == 0) {
      rule.op = strcmp(value, "write") == 0 ? OP_WRITE
                : strcmp(value, "fsync") == 0 ? OP_FSYNC
                : strcmp(value, "rename") == 0 ? OP_RENAME
                                                : OP_NONE;
    } else if (strcmp(key, "path") == 0) {
      snprintf(rule.path, sizeof rule.path, "%s", value);
    } else if (strcmp(key, "nth") == 0) {
      rule.nth = atol(value);
    } else if (strcmp(key, "errno") == 0) {
      rule.err = strcmp(value, "ENOSPC") == 0 ? ENOSPC : EIO;
    } else if (strcmp(key, "signal") == 0) {
      rule.sig = strcmp(value, "SIGTERM") == 0 ? SIGTERM : SIGINT;
    } else if (strcmp(key, "count") == 0) {
      rule.count = atol(value);
    } else if (strcmp(key, "delay_ms") == 0) {
      rule.delay_ms = atol(value);
    }
  }
}

/* The next definition of `name` (libc's), as a function pointer: POSIX's dlsym idiom. */
#define NEXT(fn, name) (*(void**)(&(fn)) = dlsym(RTLD_NEXT, name))

static int matches(const char* path) { return path != NULL && rule.path[0] != '\0' && strstr(path, rule.path) != NULL; }

static void fd_path(int fd, char* out, size_t size) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, out, size - 1);
  out[n > 0 ? n : 0] = '\0';
}

static void trace(const char* what, const char* a, const char* b) {
  const char* file = getenv("ATTNRES_FAULT_TRACE");
  if (file == NULL) return;
  static FILE* (*real_fopen)(const char*, const char*);
  if (real_fopen == NULL) NEXT(real_fopen, "fopen");
  FILE* f = real_fopen(file, "a");
  if (f == NULL) return;
  fprintf(f, b ? "%s %s %s\n" : "%s %s\n", what, a, b);
  fclose(f);
}

static FILE* wrap_fopen(const char* name, const char* path, const char* mode) {
  FILE* (*real)(const char*, const char*);
  NEXT(real, name);
  FILE* f = real(path, mode);
  parse_rule();
  if (f != NULL && rule.op == OP_WRITE && strpbrk(mode, "wa+") != NULL && matches(path) &&
      (rule.nth == 0 || ++rule.seen == rule.nth))
    rule.doomed = f;
  return f;
}

FILE* fopen(const char* path, const char* mode) { return wrap_fopen("fopen", path, mode); }
FILE* fopen64(const char* path, const char* mode) { return wrap_fopen("fopen64", path, mode); }

size_t fwrite(const void* data, size_t size, size_t n, FILE* f) {
  static size_t (*real)(const void*, size_t, size_t, FILE*);
  if (real == NULL) NEXT(real, "fwrite");
  if (f == rule.doomed) {
    if (rule.delay_ms > 0) {
      const struct timespec ts = {rule.delay_ms / 1000, (rule.delay_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    } else if (rule.sig != 0) {
      if (!rule.raised) {
        rule.raised = 1;
        for (long i = 0; i < rule.count; ++i) raise(rule.sig);
      }
    } else {
      errno = rule.err;
      return 0;
    }
  }
  return real(data, size, n, f);
}

int fflush(FILE* f) {
  static int (*real)(FILE*);
  if (real == NULL) NEXT(real, "fflush");
  if (f != NULL && f == rule.doomed && rule.delay_ms == 0 && rule.sig == 0) {
    errno = rule.err;
    return EOF;
  }
  return real(f);
}

int fclose(FILE* f) {
  static int (*real)(FILE*);
  if (real == NULL) NEXT(real, "fclose");
  if (f == rule.doomed) rule.doomed = NULL;
  return real(f);
}

int fsync(int fd) {
  static int (*real)(int);
  if (real == NULL) NEXT(real, "fsync");
  char path[PATH_MAX];
  fd_path(fd, path, sizeof path);
  trace("fsync", path, NULL);
  parse_rule();
  if (rule.op == OP_FSYNC && matches(path) && ++rule.seen == rule.nth) {
    errno = rule.err;
    return -1;
  }
  return real(fd);
}

int rename(const char* from, const char* to) {
  static int (*real)(const char*, const char*);
  if (real == NULL) NEXT(real, "rename");
  trace("rename", from, to);
  parse_rule();
  if (rule.op == OP_RENAME && matches(to) && ++rule.seen == rule.nth) {
    errno = rule.err;
    return -1;
  }
  return real(from, to);
}
