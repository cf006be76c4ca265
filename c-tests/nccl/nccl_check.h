// The checks of the NCCL face's host test programs: one PASS or FAIL line each, counted where forked
// children and their threads can count too (shared memory, atomic adds), and the log lines a call wrote.
#pragma once

#include <nccl.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/mman.h>
#include <unistd.h>
#include <cstdlib>

struct CheckCounts {
  int passed, failed;
};
// Set by init_counts(), before any check and before any fork.
inline CheckCounts* counts = nullptr;
// The file the library logs to (MSCCLPP_DEBUG_FILE), where logged() looks.
inline std::string log_path;

// Maps the counts; false if that failed.
inline bool init_counts() {
  void* mem = mmap(NULL, sizeof(CheckCounts), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return false;
  counts = static_cast<CheckCounts*>(mem);
  *counts = CheckCounts{0, 0};
  return true;
}

// Makes a temporary file (named after `program`) the library's log at NCCL's WARN level: NCCL_DEBUG_FILE,
// read by the library at its first call, so before any; log_path names it. False if it could not be made.
inline bool log_to_a_temp_file(const char* program) {
  std::string name = std::string("/tmp/") + program + ".XXXXXX";
  int fd = mkstemp(&name[0]);
  if (fd < 0) return false;
  close(fd);
  log_path = name;
  setenv("NCCL_DEBUG_FILE", log_path.c_str(), 1);
  setenv("NCCL_DEBUG", "WARN", 1);
  return true;
}

inline void check(bool ok, const std::string& what) {
  __atomic_fetch_add(ok ? &counts->passed : &counts->failed, 1, __ATOMIC_SEQ_CST);
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  std::fflush(stdout);
}

inline void expect(ncclResult_t got, ncclResult_t want, const std::string& what) {
  check(got == want, what + " -> " + std::to_string(got) + " (want " + std::to_string(want) + ")");
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The log has a line holding `text` (the WARN that names the argument, the function, the setting).
inline void logged(const std::string& text) {
  check(read_file(log_path).find(text) != std::string::npos, "log names it: " + text);
}
