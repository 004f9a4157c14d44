/* LayerNorm with both statistics in one pass: var = E[x^2] - E[x]^2, rows in parallel. */
void layernorm_fused(int N, int D, float y[N][D], const float x[N][D], const float gamma[D],
                     const float beta[D], float eps) {
  #pragma omp parallel for
  for (int i = 0; i < N; i++) {
    float sum = 0.0f, sumsq = 0.0f;
    for (int j = 0; j < D; j++) {
      sum += x[i][j];
      sumsq += x[i][j] * x[i][j];
    }
    float mean = sum / D;
    float var = sumsq / D - mean * mean;
    float rstd = 1.0f / sqrtf(var + eps);
    for (int j = 0; j < D; j++)
      y[i][j] = (x[i][j] - mean) * rstd * gamma[j] + beta[j];
  }
}
