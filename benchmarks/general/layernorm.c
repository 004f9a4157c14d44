/* LayerNorm over the last axis. */
void layernorm(int N, int D, float y[N][D], const float x[N][D], const float gamma[D],
               const float beta[D], float eps) {
  for (int i = 0; i < N; i++) {
    float mean = 0.0f;
    for (int j = 0; j < D; j++)
      mean += x[i][j];
    mean /= D;
    float var = 0.0f;
    for (int j = 0; j < D; j++)
      var += (x[i][j] - mean) * (x[i][j] - mean);
    var = var / D;
    float inv = 1.0f / sqrtf(var + eps);
    for (int j = 0; j < D; j++)
      y[i][j] = (x[i][j] - mean) * inv * gamma[j] + beta[j];
  }
}
