void fz811804(int N, int M, int K, const float x0[K + 1][N], float y0[N][K + 1], float y1[2 * K][N], float y2[K + 1], float y3[N], const float x1[N], float y4[K][N], const int q0[K + 1][2 * K], const float x2[M], const float x3[2 * M], const float x4[2 * K][M], const float x5[K + 2][M], const float x6[K][M], float y5[M + 1][M][M]) {
  for (int i = 0; i < K; i++) {
    for (int j = K - 1; j >= 0; j--) {
      for (int k = 1; k < N - 2; k++) {
        float s0 = ((0.1722f * powf((1.0f + fabsf(x0[i][k - 1])), 0.75f)) + (0.6258f * fmaxf(-1.0f, fminf(1.0f, (0.9438f * y0[k + 1][j + 1])))));
        if (s0 <= 0.0696f) {
          y0[k][j] = ((0.5f * s0) + (((0.0625f * s0) + (0.2091f * x0[i + 1][k - 1])) + (0.3757f * fmaxf(y0[k - 1][j], y1[2 * j + 1][k]))));
        } else {
          y1[2 * j][k] = ((0.5f * s0) + ((0.5244f * (((0.3078f * ((0.8914f * (x0[j][k + 1] != -0.3003f ? y2[j + 1] : y3[k])) / (1.0f + fabsf((0.8914f * (x0[j][k + 1] != -0.3003f ? y2[j + 1] : y3[k])))))) + (0.6587f * x1[k - 1])) / (1.0f + fabsf(((0.3078f * ((0.8914f * (x0[j][k + 1] != -0.3003f ? y2[j + 1] : y3[k])) / (1.0f + fabsf((0.8914f * (x0[j][k + 1] != -0.3003f ? y2[j + 1] : y3[k])))))) + (0.6587f * x1[k - 1])))))) - (0.3305f * (y3[k - 1] < -0.4432f ? x1[k] : y3[k]))));
          y1[j + i][k] = ((0.5f * s0) + (0.0312f * (k)));
        }
        y4[0][k + 1] += ((0.5666f * x0[j][k - 1]) + (0.4303f * expf((-fabsf(((0.0808f * x0[i][k - 1]) + (0.4677f * (0.01f * q0[j + 1][2 * j]))))))));
      }
      for (int k = M - 1; k >= 0; k -= 2) {
        if (k != i + 1) {
          y2[j + 1] = (((0.1395f * sinf((x0[-j + K][2] < 0.3743f ? x2[k] : x3[k]))) - (0.2039f * (0.0312f * (j - 1)))) + (0.4183f * y3[0]));
        } else {
          y0[0][j] += (0.9092f * (x4[j + i + 1][k - 1] >= 0.2208f ? x4[j + i + 2][k] : x5[0][k - 1]));
          y4[j][2] += ((0.4804f * (y0[2][j] < -0.0849f ? (y2[j + 1] / (1.0f + fabsf(y2[j + 1]))) : x5[j + 2][1])) + (0.5138f * powf((1.0f + fabsf(x1[2])), 0.75f)));
        }
      }
    }
    for (int j = M - 1; j >= 0; j--) {
      y4[i][2] -= ((0.7656f * x4[i][j]) + (0.0625f * x6[i][j]));
    }
  }
}
