/* 2 x 2 max-pool, stride 2, keeping each window's maximum and its position in the input plane
 * (h * W + w, PyTorch's indices). */
#include <math.h>

void maxpool_argmax(int N, int C, int P, int Q, float y[N][C][P][Q], int idx[N][C][P][Q],
                    const float x[N][C][2 * P][2 * Q]) {
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int p = 0; p < P; p++)
        for (int q = 0; q < Q; q++) {
          float best = -INFINITY;
          int arg = 0;
          for (int r = 0; r < 2; r++)
            for (int s = 0; s < 2; s++)
              if (x[n][c][2 * p + r][2 * q + s] > best) {
                best = x[n][c][2 * p + r][2 * q + s];
                arg = (2 * p + r) * (2 * Q) + 2 * q + s;
              }
          y[n][c][p][q] = best;
          idx[n][c][p][q] = arg;
        }
}
