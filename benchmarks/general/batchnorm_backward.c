/* Batch-norm backward (training mode) from the saved batch mean and 1/std: the two channel
 * sums first, then dx. */
void batchnorm_backward(int N, int C, int H, int W, float dx[N][C][H][W], float dgamma[C],
                        float dbeta[C], const float dy[N][C][H][W], const float x[N][C][H][W],
                        const float mean[C], const float invstd[C], const float gamma[C]) {
  for (int c = 0; c < C; c++) {
    float sum_dy = 0.0f;
    float sum_dy_xhat = 0.0f;
    for (int n = 0; n < N; n++)
      for (int h = 0; h < H; h++)
        for (int w = 0; w < W; w++) {
          sum_dy += dy[n][c][h][w];
          sum_dy_xhat += dy[n][c][h][w] * (x[n][c][h][w] - mean[c]) * invstd[c];
        }
    dbeta[c] = sum_dy;
    dgamma[c] = sum_dy_xhat;
    float m = N * H * W;
    for (int n = 0; n < N; n++)
      for (int h = 0; h < H; h++)
        for (int w = 0; w < W; w++) {
          float xhat = (x[n][c][h][w] - mean[c]) * invstd[c];
          dx[n][c][h][w] = gamma[c] * invstd[c] / m * (m * dy[n][c][h][w] - sum_dy - xhat * sum_dy_xhat);
        }
  }
}
