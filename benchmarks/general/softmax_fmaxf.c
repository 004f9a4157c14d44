/* Row softmax in three passes, the maximum by fmaxf from -INFINITY, rows in parallel. */
#include <math.h>

void softmax_fmaxf(int N, int D, float y[N][D], const float x[N][D]) {
  #pragma omp parallel for
  for (int i = 0; i < N; i++) {
    float maxval = -INFINITY;
    for (int j = 0; j < D; j++)
      maxval = fmaxf(maxval, x[i][j]);
    float sum = 0.0f;
    for (int j = 0; j < D; j++) {
      y[i][j] = expf(x[i][j] - maxval);
      sum += y[i][j];
    }
    float inv = 1.0f / sum;
    for (int j = 0; j < D; j++)
      y[i][j] *= inv;
  }
}
