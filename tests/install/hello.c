/* An outside C program, built only with `pkg-config --cflags --libs chorus`:
 * two ranks (this process and a forked child) join one communicator through a
 * unique id and allreduce; each checks every element. Exit 0 on success. */
#include <chorus/chorus.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define COUNT 100003

static int runRank(int rank, chorusUniqueId id) {
  chorusComm_t comm = NULL;
  chorusResult_t r = chorusCommInitRank(&comm, 2, id, rank);
  if (r != chorusSuccess) {
    fprintf(stderr, "hello.c rank %d: chorusCommInitRank: %s: %s\n", rank, chorusGetErrorString(r),
            chorusGetLastError(NULL));
    return 1;
  }
  float* buf = malloc(COUNT * sizeof *buf);
  if (buf == NULL) return 1;
  for (int i = 0; i < COUNT; ++i) buf[i] = (float)(i % 1000) + (float)rank * 1000.0f;
  r = chorusAllReduce(buf, buf, COUNT, chorusFloat32, chorusSum, comm, NULL);
  int bad = 0;
  if (r != chorusSuccess) {
    fprintf(stderr, "hello.c rank %d: chorusAllReduce: %s: %s\n", rank, chorusGetErrorString(r), chorusGetLastError(comm));
    bad = 1;
  }
  for (int i = 0; !bad && i < COUNT; ++i) {
    const float want = 2.0f * (float)(i % 1000) + 1000.0f; /* exact in float */
    if (buf[i] != want) {
      fprintf(stderr, "hello.c rank %d: element %d is %g, expected %g\n", rank, i, buf[i], want);
      bad = 1;
    }
  }
  free(buf);
  if ((r = chorusCommDestroy(comm)) != chorusSuccess) {
    fprintf(stderr, "hello.c rank %d: chorusCommDestroy: %s\n", rank, chorusGetErrorString(r));
    bad = 1;
  }
  return bad;
}

int main(void) {
  int version = 0;
  if (chorusGetVersion(&version) != chorusSuccess || version != CHORUS_VERSION_CODE) {
    fprintf(stderr, "hello.c: library version %d, header version %d\n", version, CHORUS_VERSION_CODE);
    return 1;
  }
  chorusUniqueId id;
  if (chorusGetUniqueId(&id) != chorusSuccess) {
    fprintf(stderr, "hello.c: chorusGetUniqueId: %s\n", chorusGetLastError(NULL));
    return 1;
  }
  fflush(NULL);
  pid_t child = fork();
  if (child < 0) {
    perror("hello.c: fork");
    return 1;
  }
  if (child == 0) _exit(runRank(1, id));
  int failed = runRank(0, id);
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "hello.c: rank 1 (pid %d) failed (wait status %#x)\n", (int)child, status);
    failed = 1;
  }
  if (!failed) printf("hello.c: 2-rank allreduce of %d floats ok (chorus %d)\n", COUNT, version);
  return failed;
}
