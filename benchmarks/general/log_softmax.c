/* Row log-softmax: x - max - log(sum exp(x - max)). */
void log_softmax(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++) {
    float top = x[i][0];
    for (int j = 1; j < D; j++)
      if (x[i][j] > top)
        top = x[i][j];
    float sum = 0.0f;
    for (int j = 0; j < D; j++)
      sum += expf(x[i][j] - top);
    float lse = top + logf(sum);
    for (int j = 0; j < D; j++)
      y[i][j] = x[i][j] - lse;
  }
}
