void fz300892(int N, int T, float y0[N], float y1[N + 1], float y2[N][N + 2], const float x0[N][N], float y3[2 * N], float y4[N + 2][N + 1], float y5[1][N][N], float y6[N], float y7[2 * N]) {
  for (int i = 0; i <= T; i++) {
    for (int j = 1; j < N - 1; j++) {
      for (int k = 0; k <= N - 1; k += 2) {
        if ((j >= 0) || (j < N)) {
          y0[k] += (1.0f + fabsf((0.6225f * logf((1.0f + fabsf(((0.5676f * sqrtf(fabsf(y1[j - 1]))) + (0.1576f * (y2[k][k + 2] > -0.401f ? y0[j - 1] : x0[k][j])))))))));
          y3[2 * k + 1] += ((0.6738f * (0.0312f * (k))) - (0.1886f * cosf(y3[k + j - 1])));
        }
        y4[k][k] = (0.7652f * fmaxf(-1.0f, fminf(1.0f, y5[0][j - 1][k])));
        y3[2 * k] -= (0.9121f * sqrtf(fabsf(y1[k])));
        y3[k] += (0.6932f * fminf(fmaxf(-1.0f, fminf(1.0f, y4[1][k])), logf((1.0f + fabsf(y4[k + 2][k + 1])))));
      }
      for (int k = 0; k <= N - 1; k++) {
        if (i <= k + 1) {
          y3[k + j] = ((0.3934f * logf((1.0f + fabsf((0.656f * y1[k + 1]))))) + (0.4921f * x0[j][k]));
          y3[2 * k] -= ((0.2924f * logf((1.0f + fabsf(x0[-k + N - 1][k])))) + (0.7043f * expf((-fabsf(y3[k])))));
        } else {
          y0[k] = (0.5297f * (y1[k] >= 0.1802f ? y0[k + 1] : x0[j][k]));
          y6[k] -= (((0.1374f * sinf(y7[0])) + (0.4011f * (((0.1298f * cosf(((0.4175f * expf((-fabsf((0.5061f * y4[j][j - 1]))))) + (0.2099f * y4[k + 1][j + 1])))) + (0.5687f * y1[-j + N - 1])) / (1.0f + fabsf(((0.1298f * cosf(((0.4175f * expf((-fabsf((0.5061f * y4[j][j - 1]))))) + (0.2099f * y4[k + 1][j + 1])))) + (0.5687f * y1[-j + N - 1]))))))) - (0.0625f * fmaxf(fmaxf(-1.0f, fminf(1.0f, y0[k])), erff(y0[k + 1]))));
        }
      }
    }
  }
}
