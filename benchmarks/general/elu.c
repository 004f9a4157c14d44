/* ELU with a ternary: y = x for x > 0, alpha (e^x - 1) otherwise. */
void elu(int N, int D, float y[N][D], const float x[N][D], float alpha) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++)
      y[i][j] = x[i][j] > 0.0f ? x[i][j] : alpha * (expf(x[i][j]) - 1.0f);
}
