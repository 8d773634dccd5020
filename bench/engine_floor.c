/* engine_floor — the raw Docker Engine API floor for bench/docker.sh: the
 * calls sbxlua's docker backend makes, made directly with libcurl on the
 * engine's unix socket (one easy handle, so the connection is kept alive
 * between calls, as sbxlua's libcurl does). No JSON library: the two fields
 * read ("Id", "ExitCode") are found by substring.
 *
 *   engine_floor create N IMAGE [BODY_JSON_FILE [TAR_FILE]]
 *       N x (POST /containers/create [+ PUT /containers/{id}/archive?path=/ TAR]
 *       + POST /containers/{id}/start); DELETE ?force (not timed).
 *       Without BODY_JSON_FILE the body is {"Image":IMAGE,"Entrypoint":
 *       ["sleep","infinity"],"Labels":{"sbxbench":$SBX_BENCH_RUN}}; a file's
 *       body is used as is (IMAGE ignored).
 *   engine_floor exec N IMAGE     one container; N x (POST exec {Cmd:["true"]},
 *       POST exec/{id}/start {"Detach":false} read to the end, GET exec/{id}/json)
 *   engine_floor rw N IMAGE       one container; N x (PUT archive of a 1 KiB
 *       tmp/f.txt at path=/, GET archive?path=/tmp/f.txt)
 *   engine_floor par N IMAGE [CMDS]   the engine's parallel floor: N workers
 *       (one process and connection each) create+start a container each at
 *       once; when all are up, each runs CMDS (default 0) engine execs of
 *       `true`; then all DELETE ?force at once. Prints
 *       "create_ms X exec_ms X destroy_ms X wall_ms X n N" (each phase: from
 *       its go to the last worker's end; wall_ms = create + destroy, the
 *       part of a job's lifecycle no client can avoid; exec_ms apart).
 *
 * Output (stdout): one "s <ms>" line per timed sample, then
 * "p50 X p90 X mean X min X n N". Per-call p50s go to stderr.
 * Containers are named sbxbench-floor-<pid>-<i> and labelled
 * sbxbench=$SBX_BENCH_RUN (default 1).
 * Environment: DOCKER_SOCK (default /var/run/docker.sock), API (default v1.41),
 * WARM (warm-up iterations, not reported; default 1 for create, 10 otherwise).
 */
#define _POSIX_C_SOURCE 200809L
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

static CURL *h;
static const char *sock, *api;
static char *buf;
static size_t blen, bcap;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static size_t sink(char *p, size_t sz, size_t n, void *u) {
  (void)u;
  size_t k = sz * n;
  if (blen + k + 1 > bcap) {
    bcap = (blen + k + 1) * 2;
    buf = realloc(buf, bcap);
    if (!buf) abort();
  }
  memcpy(buf + blen, p, k);
  blen += k;
  buf[blen] = 0;
  return k;
}

/* One request; returns the HTTP status and leaves the body in buf. */
static long req(const char *method, const char *path, const char *ctype, const char *body, size_t blen_in) {
  char url[512];
  snprintf(url, sizeof url, "http://docker/%s%s", api, path);
  blen = 0;
  if (buf) buf[0] = 0;
  curl_easy_reset(h);
  curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, sock);
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
  curl_easy_setopt(h, CURLOPT_TIMEOUT, 120L);
  struct curl_slist *hd = NULL;
  hd = curl_slist_append(hd, "Expect:");
  if (ctype) {
    char ct[128];
    snprintf(ct, sizeof ct, "Content-Type: %s", ctype);
    hd = curl_slist_append(hd, ct);
  }
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
  if (body) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)blen_in);
  } else if (!strcmp(method, "POST") || !strcmp(method, "PUT")) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
  }
  CURLcode rc = curl_easy_perform(h);
  curl_slist_free_all(hd);
  if (rc != CURLE_OK) {
    fprintf(stderr, "engine_floor: %s %s: %s\n", method, path, curl_easy_strerror(rc));
    exit(1);
  }
  long st = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
  return st;
}

static void want(long got, long a, long b, const char *what) {
  if (got != a && got != b) {
    fprintf(stderr, "engine_floor: %s: HTTP %ld: %.300s\n", what, got, buf ? buf : "");
    exit(1);
  }
}

static void json_id(char *out, size_t n) {
  const char *p = buf ? strstr(buf, "\"Id\":\"") : NULL;
  if (!p) { fprintf(stderr, "engine_floor: no Id in %.200s\n", buf ? buf : ""); exit(1); }
  p += 6;
  size_t i = 0;
  while (p[i] && p[i] != '"' && i + 1 < n) { out[i] = p[i]; i++; }
  out[i] = 0;
}

static char *slurp(const char *file, size_t *len) {
  FILE *f = fopen(file, "rb");
  if (!f) { perror(file); exit(2); }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *p = malloc(n + 1);
  if (fread(p, 1, n, f) != (size_t)n) { perror(file); exit(2); }
  p[n] = 0;
  fclose(f);
  *len = n;
  return p;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
/* nearest rank, as bench/common.lua */
static double pct(double *s, int n, double p) {
  int i = (int)(p * n + 0.5);
  if (i < 1) i = 1;
  if (i > n) i = n;
  return s[i - 1];
}
static void report(FILE *out, const char *prefix, double *t, int n) {
  double *s = malloc(sizeof(double) * n), sum = 0;
  memcpy(s, t, sizeof(double) * n);
  qsort(s, n, sizeof(double), cmp);
  for (int i = 0; i < n; i++) sum += s[i];
  fprintf(out, "%sp50 %.4f p90 %.4f mean %.4f min %.4f n %d\n", prefix, pct(s, n, .5), pct(s, n, .9),
          sum / n, s[0], n);
  free(s);
}

static char *plain_body(const char *image, const char *cmd) {
  char *b = malloc(1024);
  const char *run = getenv("SBX_BENCH_RUN") ? getenv("SBX_BENCH_RUN") : "1";
  snprintf(b, 1024, "{\"Image\":\"%s\",\"Entrypoint\":%s,\"Labels\":{\"sbxbench\":\"%s\"}}", image, cmd, run);
  return b;
}

static int seq;
static void create(const char *body, size_t len, const char *tar, size_t tarlen, char *id, double *t3) {
  char path[256];
  snprintf(path, sizeof path, "/containers/create?name=sbxbench-floor-%d-%d", (int)getpid(), seq++);
  double a = now_ms();
  want(req("POST", path, "application/json", body, len), 201, 201, "create");
  json_id(id, 80);
  double b = now_ms();
  if (tar) {
    snprintf(path, sizeof path, "/containers/%s/archive?path=/", id);
    want(req("PUT", path, "application/x-tar", tar, tarlen), 200, 200, "put archive");
  }
  double c = now_ms();
  snprintf(path, sizeof path, "/containers/%s/start", id);
  want(req("POST", path, NULL, NULL, 0), 204, 304, "start");
  double d = now_ms();
  if (t3) { t3[0] = b - a; t3[1] = c - b; t3[2] = d - c; }
}

static void destroy(const char *id) {
  char path[256];
  snprintf(path, sizeof path, "/containers/%s?force=true&v=true", id);
  want(req("DELETE", path, NULL, NULL, 0), 204, 404, "delete");
}

/* A ustar archive with one regular file. */
static char *ustar(const char *name, const char *data, size_t n, size_t *outlen) {
  size_t padded = (n + 511) / 512 * 512, total = 512 + padded + 1024;
  char *t = calloc(1, total), *hd = t;
  snprintf(hd, 100, "%s", name);
  snprintf(hd + 100, 8, "%07o", 0644);
  snprintf(hd + 108, 8, "%07o", 0);
  snprintf(hd + 116, 8, "%07o", 0);
  snprintf(hd + 124, 12, "%011zo", n);
  snprintf(hd + 136, 12, "%011lo", (unsigned long)time(NULL));
  memset(hd + 148, ' ', 8);
  hd[156] = '0';
  memcpy(hd + 257, "ustar", 6);
  memcpy(hd + 263, "00", 2);
  unsigned sum = 0;
  for (int i = 0; i < 512; i++) sum += (unsigned char)hd[i];
  snprintf(hd + 148, 8, "%06o", sum);
  hd[155] = ' ';
  memcpy(t + 512, data, n);
  *outlen = total;
  return t;
}

static void exec_true(const char *id) {
  const char *xbody = "{\"AttachStdout\":true,\"AttachStderr\":true,\"Tty\":false,\"Cmd\":[\"true\"]}";
  const char *sbody = "{\"Detach\":false,\"Tty\":false}";
  char path[256], eid[80];
  snprintf(path, sizeof path, "/containers/%s/exec", id);
  want(req("POST", path, "application/json", xbody, strlen(xbody)), 201, 201, "exec create");
  json_id(eid, sizeof eid);
  snprintf(path, sizeof path, "/exec/%s/start", eid);
  want(req("POST", path, "application/json", sbody, strlen(sbody)), 200, 101, "exec start");
  snprintf(path, sizeof path, "/exec/%s/json", eid);
  want(req("GET", path, NULL, NULL, 0), 200, 200, "exec inspect");
}

/* par: each worker reads one byte from `go` before each phase and writes
** one to `back` after it; the parent times the phases. */
static int par(int n, const char *image, int cmds) {
  int go[2], back[2];
  if (pipe(go) < 0 || pipe(back) < 0) { perror("pipe"); return 1; }
  char *body = plain_body(image, "[\"sleep\",\"infinity\"]");
  for (int w = 0; w < n; w++) {
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid > 0) continue;
    char id[80], b;
    h = curl_easy_init();          /* a connection of its own */
    seq = w;
    for (int phase = 0; phase < 3; phase++) {
      if (read(go[0], &b, 1) != 1) _exit(1);
      if (phase == 0) create(body, strlen(body), NULL, 0, id, NULL);
      else if (phase == 1) for (int i = 0; i < cmds; i++) exec_true(id);
      else destroy(id);
      if (write(back[1], "x", 1) != 1) _exit(1);
    }
    _exit(0);
  }
  double ms[3];
  char b;
  for (int phase = 0; phase < 3; phase++) {
    double t0 = now_ms();
    for (int w = 0; w < n; w++)
      if (write(go[1], "g", 1) != 1) return 1;
    for (int w = 0; w < n; w++)
      if (read(back[0], &b, 1) != 1) { fprintf(stderr, "engine_floor: a worker failed\n"); return 1; }
    ms[phase] = now_ms() - t0;
  }
  int st, bad = 0;
  while (wait(&st) > 0) bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  printf("create_ms %.2f exec_ms %.2f destroy_ms %.2f wall_ms %.2f n %d\n", ms[0], ms[1], ms[2],
         ms[0] + ms[2], n);
  return bad;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: engine_floor create|exec|rw|par N IMAGE [BODY_JSON [TAR] | CMDS]\n");
    return 2;
  }
  const char *mode = argv[1], *image = argv[3];
  int n = atoi(argv[2]);
  sock = getenv("DOCKER_SOCK") ? getenv("DOCKER_SOCK") : "/var/run/docker.sock";
  api = getenv("API") ? getenv("API") : "v1.41";
  int warm = getenv("WARM") ? atoi(getenv("WARM")) : (!strcmp(mode, "create") ? 1 : 10);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  if (!strcmp(mode, "par")) return par(n, image, argc > 4 ? atoi(argv[4]) : 0);
  h = curl_easy_init();
  double *t = calloc(n + 1, sizeof(double)), *c1 = calloc(n + 1, sizeof(double)),
         *c2 = calloc(n + 1, sizeof(double)), *c3 = calloc(n + 1, sizeof(double));
  char id[80], path[256];

  if (!strcmp(mode, "create")) {
    size_t blen_, tarlen = 0;
    char *body, *tar = NULL;
    if (argc > 4) body = slurp(argv[4], &blen_);
    else { body = plain_body(image, "[\"sleep\",\"infinity\"]"); blen_ = strlen(body); }
    if (argc > 5) tar = slurp(argv[5], &tarlen);
    for (int i = -warm; i < n; i++) {
      double a = now_ms(), t3[3];
      create(body, blen_, tar, tarlen, id, t3);
      double b = now_ms();
      destroy(id);
      if (i >= 0) { t[i] = b - a; c1[i] = t3[0]; c2[i] = t3[1]; c3[i] = t3[2]; }
    }
    report(stderr, "  create:  ", c1, n);
    if (tar) report(stderr, "  archive: ", c2, n);
    report(stderr, "  start:   ", c3, n);
  } else {
    char *body = plain_body(image, "[\"sleep\",\"infinity\"]");
    create(body, strlen(body), NULL, 0, id, NULL);
    char data[1024];
    for (size_t i = 0; i < sizeof data; i++) data[i] = 'a' + i % 26;
    size_t tarlen;
    char *tar = ustar("tmp/f.txt", data, sizeof data, &tarlen);
    const char *xbody = "{\"AttachStdout\":true,\"AttachStderr\":true,\"Tty\":false,\"Cmd\":[\"true\"]}";
    const char *sbody = "{\"Detach\":false,\"Tty\":false}";
    for (int i = -warm; i < n; i++) {
      double a = now_ms(), b, c;
      char eid[80];
      if (!strcmp(mode, "exec")) {
        snprintf(path, sizeof path, "/containers/%s/exec", id);
        want(req("POST", path, "application/json", xbody, strlen(xbody)), 201, 201, "exec create");
        json_id(eid, sizeof eid);
        b = now_ms();
        snprintf(path, sizeof path, "/exec/%s/start", eid);
        want(req("POST", path, "application/json", sbody, strlen(sbody)), 200, 101, "exec start");
        c = now_ms();
        snprintf(path, sizeof path, "/exec/%s/json", eid);
        want(req("GET", path, NULL, NULL, 0), 200, 200, "exec inspect");
        if (!strstr(buf, "\"ExitCode\":0")) { fprintf(stderr, "engine_floor: exit: %.200s\n", buf); return 1; }
      } else if (!strcmp(mode, "rw")) {
        snprintf(path, sizeof path, "/containers/%s/archive?path=/", id);
        want(req("PUT", path, "application/x-tar", tar, tarlen), 200, 200, "put archive");
        b = c = now_ms();
        snprintf(path, sizeof path, "/containers/%s/archive?path=/tmp/f.txt", id);
        want(req("GET", path, NULL, NULL, 0), 200, 200, "get archive");
        if (blen < 512 + sizeof data || memcmp(buf + 512, data, sizeof data)) {
          fprintf(stderr, "engine_floor: read back differs\n");
          return 1;
        }
      } else {
        fprintf(stderr, "engine_floor: unknown mode %s\n", mode);
        return 2;
      }
      double d = now_ms();
      if (i >= 0) { t[i] = d - a; c1[i] = b - a; c2[i] = c - b; c3[i] = d - c; }
    }
    destroy(id);
    if (!strcmp(mode, "exec")) {
      report(stderr, "  exec create:  ", c1, n);
      report(stderr, "  exec start:   ", c2, n);
      report(stderr, "  exec inspect: ", c3, n);
    } else {
      report(stderr, "  put archive: ", c1, n);
      report(stderr, "  get archive: ", c3, n);
    }
  }
  for (int i = 0; i < n; i++) printf("s %.4f\n", t[i]);
  report(stdout, "", t, n);
  curl_easy_cleanup(h);
  return 0;
}
