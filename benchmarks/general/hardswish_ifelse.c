/* Hard swish by cases, with if/else on a local. */
void hardswish_ifelse(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++) {
      float v = x[i][j];
      if (v <= -3.0f)
        y[i][j] = 0.0f;
      else if (v >= 3.0f)
        y[i][j] = v;
      else
        y[i][j] = v * (v + 3.0f) / 6.0f;
    }
}
