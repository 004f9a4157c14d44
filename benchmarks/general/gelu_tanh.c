/* GELU, tanh approximation (GPT-2's), rows in parallel as llm.c writes it. */
void gelu_tanh(int N, int D, float y[N][D], const float x[N][D]) {
  #pragma omp parallel for
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++) {
      float v = x[i][j];
      float cube = 0.044715f * v * v * v;
      y[i][j] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + cube)));
    }
}
