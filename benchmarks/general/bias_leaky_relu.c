/* Bias add then leaky ReLU, through a local and if/else on it. */
void bias_leaky_relu(int N, int D, float y[N][D], const float x[N][D], const float b[D],
                     float slope) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++) {
      float t = x[i][j] + b[j];
      if (t > 0.0f)
        y[i][j] = t;
      else
        y[i][j] = slope * t;
    }
}
