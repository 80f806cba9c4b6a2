/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Replays inputs through the fuzz harness without libFuzzer, so the seed
 * corpus and every saved crash stay regression tests in the normal build.
 * Usage: fuzz_replay DIR_OR_FILE...  (directories: every regular file in
 * them). Exit 0 when every input ran; the harness abort()s on a failure.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    perror(path);
    return 1;
  }
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap) {
      cap = cap ? cap * 2 : 4096;
      uint8_t *nb = realloc(buf, cap);
      if (nb == NULL) {
        fprintf(stderr, "%s: out of memory\n", path);
        free(buf);
        fclose(f);
        return 1;
      }
      buf = nb;
    }
    size_t got = fread(buf + len, 1, cap - len, f);
    len += got;
    if (got == 0) break;
  }
  int err = ferror(f);
  fclose(f);
  if (err) {
    fprintf(stderr, "%s: read error\n", path);
    free(buf);
    return 1;
  }
  printf("replay %s (%zu bytes)\n", path, len);
  fflush(stdout);
  LLVMFuzzerTestOneInput(buf, len);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  int failed = 0, count = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      perror(argv[i]);
      failed = 1;
      continue;
    }
    if (!S_ISDIR(st.st_mode)) {
      failed |= replay_file(argv[i]);
      count++;
      continue;
    }
    DIR *d = opendir(argv[i]);
    if (d == NULL) {
      perror(argv[i]);
      failed = 1;
      continue;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.') continue; /* ., .. and .gitkeep */
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
      struct stat fst;
      if (stat(path, &fst) != 0 || !S_ISREG(fst.st_mode)) continue;
      failed |= replay_file(path);
      count++;
    }
    closedir(d);
  }
  printf("%d inputs replayed\n", count);
  return failed;
}
