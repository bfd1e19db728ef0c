// Files are never half-written: write to a temporary beside the target, fsync, rename, fsync
// the directory. A reader sees the old file or the new one, whole, whatever happens in between
// (an error, a full disk, a signal, a crash). Guarantees and tests: docs/reliability.md.
#pragma once

#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace attnres {

// Calls write(file) on a temporary file, then fsyncs and renames it over `path`.
// On any failure the temporary is removed and an Error naming `path` is thrown. Temporaries
// left beside `path` by processes that no longer run (killed mid-write) are removed first.
void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write);

// The temporary a writer of `path` uses: ".NAME.tmp.PID" in the same directory (so the rename
// stays within one file system).
std::string temporary_path(const std::string& path);

// Removes ".NAME.tmp.PID" files beside `path` whose process is gone; best effort.
void remove_stale_temporaries(const std::string& path);

// Flushes, fsyncs and closes `file` (open on the temporary `tmp`), renames it to `path` and
// syncs the directory. On failure removes `tmp` and throws an Error naming the file.
void commit_file(std::FILE* file, const std::string& tmp, const std::string& path);

void write_text_atomically(const std::string& path, const std::string& text);

// What write_text_guarded did: wrote a new file, replaced one of other contents, or found the
// same text already there (and wrote nothing).
enum class GuardedWrite { kCreated, kReplaced, kUnchanged };

// write_text_atomically for files a user may have written or committed: a file at `path` with
// other contents is replaced only when `replace` (else an Error: "'PATH' exists with other
// contents; not replaced: HINT"); one with the same contents is left as it is.
GuardedWrite write_text_guarded(const std::string& path, const std::string& text, bool replace, std::string_view hint);

// fwrite that throws an Error naming `path` on a short write.
void write_bytes(std::FILE* file, const void* data, std::size_t size, const std::string& path);

std::string read_text_file(const std::string& path);

}  // namespace attnres
