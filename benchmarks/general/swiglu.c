/* SwiGLU on a fused projection: the first D columns are the gate, the next D the value. */
void swiglu(int N, int D, float y[N][D], const float x[N][2 * D]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++) {
      float gate = x[i][j];
      float value = x[i][j + D];
      float swish = gate / (1.0f + expf(-gate));
      y[i][j] = swish * value;
    }
}
