// log_capture.h: the library's log lines, kept by a GPU test program (mscclppSetLogHandler(captureLog)) so
// that its cases can check what the library said, and echoed to stderr with the rank (set gLogRank once it
// is known).
#pragma once

#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

// Never destroyed: the library may log from its own threads until the process is gone.
inline std::mutex& gLogMutex = *new std::mutex;
inline std::vector<std::string>& gLog = *new std::vector<std::string>;
inline int gLogRank = -1;

inline void captureLog(const char* msg)
{
  std::lock_guard<std::mutex> lock(gLogMutex);
  std::string m = msg ? msg : "(null)";
  while (!m.empty() && (m.back() == '\n' || m.back() == '\r')) m.pop_back();
  gLog.push_back(m);
  fprintf(stderr, "[rank %d] library log: %s\n", gLogRank, m.c_str());
}

// The number of lines kept so far: a mark from which a case looks for what its calls logged.
inline size_t logCount()
{
  std::lock_guard<std::mutex> lock(gLogMutex);
  return gLog.size();
}
