/* LayerNorm backward as llm.c writes it: dx from the saved mean and 1/std, and dgamma and
 * dbeta accumulated over the rows. */
void layernorm_backward(int N, int D, float dx[N][D], float dgamma[D], float dbeta[D],
                        const float dy[N][D], const float x[N][D], const float mean[N],
                        const float rstd[N], const float gamma[D]) {
  for (int i = 0; i < N; i++) {
    float dnorm_mean = 0.0f;
    float dnorm_norm_mean = 0.0f;
    for (int j = 0; j < D; j++) {
      float norm = (x[i][j] - mean[i]) * rstd[i];
      float dnorm = gamma[j] * dy[i][j];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean = dnorm_mean / D;
    dnorm_norm_mean = dnorm_norm_mean / D;
    for (int j = 0; j < D; j++) {
      float norm = (x[i][j] - mean[i]) * rstd[i];
      float dnorm = gamma[j] * dy[i][j];
      dbeta[j] += dy[i][j];
      dgamma[j] += norm * dy[i][j];
      dx[i][j] = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[i];
    }
  }
}
