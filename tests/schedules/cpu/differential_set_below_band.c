void f(int N, float y0[N], float y1[2 * N + 1], float y2[N], const float x0[N + 1], float y3[N + 3], float y4[N], const int q0[N + 1][N + 1], float y5[N]) {
  for (int i = N - 1; i >= 0; i--) {
    y0[i] = 0.5f;
  }
  for (int i = 0; i <= N; i++) {
    y1[2 * i] = 0.5f;
    float s0 = 0.7629f;
    for (int j = i; j < N; j++) {
      s0 = 0.9772f;
    }
    y3[i] = y1[2 * i];
    for (int j = 0; j < N; j++) {
      if ((i >= 0) && (i < N - 1)) {
        y3[j] = y5[j];
      } else {
        y4[j] -= (0.2925f * fmaxf(-1.0f, fminf(1.0f, y4[0])));
      }
      y5[j] += ((0.5782f * (0.01f * q0[j + 1][i])) + (0.2301f * expf((-fabsf(y5[0])))));
      float s1 = (((0.2056f * y2[j]) + (0.3714f * y3[i + 2])) + (0.0625f * fminf(y1[j + i], y0[j])));
      for (int k = 1; k < N; k++) {
        s1 = fmaxf(s1, (((0.0625f * x0[2]) - (0.3728f * s1)) + (0.1394f * (y5[0] >= -0.0024f ? x0[k - 1] : sinf(y1[k + j])))));
      }
      y1[j + i] += (0.5f * s1);
    }
  }
}
