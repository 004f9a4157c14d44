/* Row softmax in two passes: the maximum and the rescaled sum of exponentials together
 * (online softmax), then the normalised values. */
void softmax_online(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++) {
    float m = x[i][0];
    float s = 1.0f;
    for (int j = 1; j < D; j++) {
      float m_new = fmaxf(m, x[i][j]);
      s = s * expf(m - m_new) + expf(x[i][j] - m_new);
      m = m_new;
    }
    for (int j = 0; j < D; j++)
      y[i][j] = expf(x[i][j] - m) / s;
  }
}
