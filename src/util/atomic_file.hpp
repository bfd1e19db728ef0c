// Files are never half-written: write to a temporary beside the target, fsync, rename.
#pragma once

#include <cstdio>
#include <functional>
#include <span>
#include <string>

namespace attnres {

// Calls write(file) on a temporary file, then fsyncs and renames it over `path`.
// On any failure the temporary is removed and an Error naming `path` is thrown.
void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write);

// Flushes, fsyncs and closes `file` (open on the temporary `tmp`), renames it to `path` and
// syncs the directory. On failure removes `tmp` and throws an Error naming the file.
void commit_file(std::FILE* file, const std::string& tmp, const std::string& path);

void write_text_atomically(const std::string& path, const std::string& text);

// fwrite that throws on short writes.
void write_bytes(std::FILE* file, const void* data, std::size_t size, const std::string& path);

std::string read_text_file(const std::string& path);

}  // namespace attnres
