/* Calls the library `polydl compile examples/matmul.c -p M=4 -p N=3 -p K=5 -o out` writes:
 *   cc examples/aot/main.c -Iout -Lout -lmatmul -Wl,-rpath,"$PWD/out" -o matmul_demo && ./matmul_demo
 * It prints C = A B for A[i][k] = i + k and B[k][j] = k - j, one row a line. */
#include <stdio.h>

#include "matmul.h"

int main(void) {
  float a[4][5], b[5][3], c[4][3] = {{0}};
  for (int i = 0; i < 4; i++)
    for (int k = 0; k < 5; k++) a[i][k] = (float)(i + k);
  for (int k = 0; k < 5; k++)
    for (int j = 0; j < 3; j++) b[k][j] = (float)(k - j);
  if (matmul(&c[0][0], &a[0][0], &b[0][0]) != 0) return 1;
  for (int i = 0; i < 4; i++) printf("%g %g %g\n", c[i][0], c[i][1], c[i][2]);
  return 0;
}
