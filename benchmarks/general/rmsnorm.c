/* RMSNorm over the last axis. */
void rmsnorm(int N, int D, float y[N][D], const float x[N][D], const float gamma[D], float eps) {
  for (int i = 0; i < N; i++) {
    float ss = 0.0f;
    for (int j = 0; j < D; j++)
      ss += x[i][j] * x[i][j];
    float inv = 1.0f / sqrtf(ss / D + eps);
    for (int j = 0; j < D; j++)
      y[i][j] = x[i][j] * inv * gamma[j];
  }
}
