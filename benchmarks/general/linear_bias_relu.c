/* Fully-connected layer with bias and ReLU: y = max(x w^T + b, 0). */
void linear_bias_relu(int N, int C, int K, float y[N][K],
                      const float x[N][C], const float w[K][C], const float b[K]) {
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++)
      for (int c = 0; c < C; c++)
        y[n][k] += x[n][c] * w[k][c];
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++)
      y[n][k] = fmaxf(y[n][k] + b[k], 0.0f);
}
