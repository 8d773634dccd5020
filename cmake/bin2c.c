/* bin2c IN OUT NAME: writes a C file defining `const unsigned char NAME[]`
** and `const size_t NAME_len` with IN's bytes (build-time helper). */
#include <stdio.h>

int main(int argc, char **argv) {
  if (argc != 4) return 2;
  FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "w");
  if (!in || !out) return 1;
  fprintf(out, "#include <stddef.h>\nconst unsigned char %s[] = {", argv[3]);
  size_t n = 0;
  int c;
  while ((c = getc(in)) != EOF) fprintf(out, "%s%d,", n++ % 32 ? "" : "\n", c);
  fprintf(out, "0};\nconst size_t %s_len = %zu;\n", argv[3], n);
  return fclose(out) == 0 && !ferror(in) ? 0 : 1;
}
