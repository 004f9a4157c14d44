/* Inclusive prefix sum along each row through a running local. */
void cumsum_local(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++) {
    float acc = 0.0f;
    for (int j = 0; j < D; j++) {
      acc += x[i][j];
      y[i][j] = acc;
    }
  }
}
