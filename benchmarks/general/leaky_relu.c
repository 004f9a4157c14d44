/* Leaky ReLU. */
void leaky_relu(int N, int D, float y[N][D], const float x[N][D], float slope) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++) {
      float t = x[i][j];
      if (t > 0) y[i][j] = t; else y[i][j] = slope * t;
    }
}
