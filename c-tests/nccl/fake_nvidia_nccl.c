/* A stand-in for NVIDIA's libnccl.so.2 in the tests of MSCCLPP_NCCL_FALLBACK (no GPU, no network).
 * Built by make as build/tests/nccl/fake/libnccl.so.2 (soname libnccl.so.2, like NVIDIA's), and with
 * -DFAKE_NCCL_INCOMPLETE, lacking ncclCommAbort, as build/tests/nccl/fake-incomplete/libnccl.so.2.
 *
 * It exports the functions the fallback resolves, reports version 22901 (ours says 23203), and appends one
 * line per call to the file named by FAKE_NCCL_LOG. Its ncclSend calls its own exported ncclGetVersion and
 * records what that returned: 22901 only if the call stayed inside this library (RTLD_DEEPBIND), 23203 if
 * it reached our libnccl.so.2's export instead. FAKE_NCCL_INIT_FAIL=1 makes ncclCommInitRank refuse, as
 * NVIDIA's does for two ranks on one GPU. fake_nccl_set_async_error sets what ncclCommGetAsyncError says.
 * Plain C, its own types: it must not see our nccl.h. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_VERSION 22901

typedef struct {
  char internal[128];
} ncclUniqueId;

typedef struct fakeComm {
  int rank;
  int nranks;
  char id[16];
} * ncclComm_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int next_id = 0, next_op = 100, async_error = 0;
static char last_error[256] = "";

static void record(const char* fmt, ...) {
  const char* path = getenv("FAKE_NCCL_LOG");
  if (!path) return;
  pthread_mutex_lock(&lock);
  FILE* f = fopen(path, "a");
  if (f) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
  }
  pthread_mutex_unlock(&lock);
}

int ncclGetVersion(int* version) {
  *version = FAKE_VERSION;
  return 0;
}

int ncclGetUniqueId(ncclUniqueId* id) {
  memset(id, 0, sizeof(*id));
  pthread_mutex_lock(&lock);
  snprintf(id->internal, 16, "FAKEID%d", ++next_id % 1000);
  pthread_mutex_unlock(&lock);
  record("ncclGetUniqueId id=%s", id->internal);
  return 0;
}

int ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  const char* fail = getenv("FAKE_NCCL_INIT_FAIL");
  if (fail && strcmp(fail, "1") == 0) {
    snprintf(last_error, sizeof(last_error), "fake: duplicate GPU detected (two ranks on one GPU)");
    record("ncclCommInitRank refused rank=%d", rank);
    return 5; /* ncclInvalidUsage */
  }
  struct fakeComm* c = calloc(1, sizeof(*c));
  c->rank = rank;
  c->nranks = nranks;
  memcpy(c->id, id.internal, sizeof(c->id) - 1);
  *comm = c;
  record("ncclCommInitRank rank=%d nranks=%d id=%s comm=%p", rank, nranks, c->id, (void*)c);
  return 0;
}

int ncclCommFinalize(ncclComm_t comm) {
  record("ncclCommFinalize comm=%p", (void*)comm);
  return 0;
}

int ncclCommDestroy(ncclComm_t comm) {
  record("ncclCommDestroy comm=%p", (void*)comm);
  free(comm);
  return 0;
}

#ifndef FAKE_NCCL_INCOMPLETE
int ncclCommAbort(ncclComm_t comm) {
  record("ncclCommAbort comm=%p", (void*)comm);
  free(comm);
  return 0;
}
#endif

void fake_nccl_set_async_error(int value) {
  async_error = value;
  snprintf(last_error, sizeof(last_error), "fake: a remote peer is gone");
}

int ncclCommGetAsyncError(ncclComm_t comm, int* result) {
  (void)comm;
  *result = async_error;
  return 0;
}

int ncclCommCount(ncclComm_t comm, int* count) {
  *count = comm->nranks;
  return 0;
}

int ncclCommUserRank(ncclComm_t comm, int* rank) {
  *rank = comm->rank;
  return 0;
}

const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return last_error;
}

int ncclGroupStart(void) {
  record("ncclGroupStart");
  return 0;
}

int ncclGroupEnd(void) {
  record("ncclGroupEnd");
  return 0;
}

int ncclAllReduce(const void* s, void* r, size_t count, int datatype, int op, ncclComm_t comm, void* stream) {
  record("ncclAllReduce send=%p recv=%p count=%zu datatype=%d op=%d comm=%p stream=%p", s, r, count, datatype, op,
         (void*)comm, stream);
  return 0;
}

int ncclReduceScatter(const void* s, void* r, size_t count, int datatype, int op, ncclComm_t comm, void* stream) {
  record("ncclReduceScatter send=%p recv=%p count=%zu datatype=%d op=%d comm=%p stream=%p", s, r, count, datatype,
         op, (void*)comm, stream);
  return 0;
}

int ncclAllGather(const void* s, void* r, size_t count, int datatype, ncclComm_t comm, void* stream) {
  record("ncclAllGather send=%p recv=%p count=%zu datatype=%d comm=%p stream=%p", s, r, count, datatype,
         (void*)comm, stream);
  return 0;
}

int ncclAlltoAll(const void* s, void* r, size_t count, int datatype, ncclComm_t comm, void* stream) {
  record("ncclAlltoAll send=%p recv=%p count=%zu datatype=%d comm=%p stream=%p", s, r, count, datatype,
         (void*)comm, stream);
  return 0;
}

int ncclBroadcast(const void* s, void* r, size_t count, int datatype, int root, ncclComm_t comm, void* stream) {
  record("ncclBroadcast send=%p recv=%p count=%zu datatype=%d root=%d comm=%p stream=%p", s, r, count, datatype,
         root, (void*)comm, stream);
  return 0;
}

int ncclReduce(const void* s, void* r, size_t count, int datatype, int op, int root, ncclComm_t comm, void* stream) {
  record("ncclReduce send=%p recv=%p count=%zu datatype=%d op=%d root=%d comm=%p stream=%p", s, r, count, datatype,
         op, root, (void*)comm, stream);
  return 0;
}

int ncclGather(const void* s, void* r, size_t count, int datatype, int root, ncclComm_t comm, void* stream) {
  record("ncclGather send=%p recv=%p count=%zu datatype=%d root=%d comm=%p stream=%p", s, r, count, datatype, root,
         (void*)comm, stream);
  return 0;
}

int ncclScatter(const void* s, void* r, size_t count, int datatype, int root, ncclComm_t comm, void* stream) {
  record("ncclScatter send=%p recv=%p count=%zu datatype=%d root=%d comm=%p stream=%p", s, r, count, datatype, root,
         (void*)comm, stream);
  return 0;
}

int ncclSend(const void* buff, size_t count, int datatype, int peer, ncclComm_t comm, void* stream) {
  int version = 0;
  ncclGetVersion(&version); /* through the PLT: whichever ncclGetVersion the loader bound */
  record("ncclSend buff=%p count=%zu datatype=%d peer=%d comm=%p stream=%p version=%d", buff, count, datatype, peer,
         (void*)comm, stream, version);
  return 0;
}

int ncclRecv(void* buff, size_t count, int datatype, int peer, ncclComm_t comm, void* stream) {
  record("ncclRecv buff=%p count=%zu datatype=%d peer=%d comm=%p stream=%p", buff, count, datatype, peer,
         (void*)comm, stream);
  return 0;
}

/* The new communicator's rank is the key; its size the color plus 1 (so that a test sees both travel). */
int ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, void* config) {
  (void)config;
  if (color < 0) {
    *newcomm = NULL;
    record("ncclCommSplit comm=%p color=%d key=%d new=(nil)", (void*)comm, color, key);
    return 0;
  }
  struct fakeComm* c = calloc(1, sizeof(*c));
  c->rank = key;
  c->nranks = color + 1;
  *newcomm = c;
  record("ncclCommSplit comm=%p color=%d key=%d new=%p", (void*)comm, color, key, (void*)c);
  return 0;
}

int ncclCommShrink(ncclComm_t comm, int* exclude, int count, ncclComm_t* newcomm, void* config, int flags) {
  (void)config;
  struct fakeComm* c = calloc(1, sizeof(*c));
  c->rank = 0;
  c->nranks = comm->nranks - count;
  *newcomm = c;
  record("ncclCommShrink comm=%p count=%d first=%d flags=%d new=%p", (void*)comm, count, count ? exclude[0] : -1,
         flags, (void*)c);
  return 0;
}

int ncclCommRevoke(ncclComm_t comm, int flags) {
  record("ncclCommRevoke comm=%p flags=%d", (void*)comm, flags);
  return 0;
}

int ncclRedOpCreatePreMulSum(int* op, void* scalar, int datatype, int residence, ncclComm_t comm) {
  (void)scalar;
  pthread_mutex_lock(&lock);
  *op = next_op++;
  pthread_mutex_unlock(&lock);
  record("ncclRedOpCreatePreMulSum op=%d datatype=%d residence=%d comm=%p", *op, datatype, residence, (void*)comm);
  return 0;
}

int ncclRedOpDestroy(int op, ncclComm_t comm) {
  record("ncclRedOpDestroy op=%d comm=%p", op, (void*)comm);
  return 0;
}
