/* Embedding lookup: each token's row of the table. */
void embedding(int T, int V, int D, float out[T][D], const int tok[T], const float emb[V][D]) {
  for (int i = 0; i < T; i++)
    for (int j = 0; j < D; j++)
      out[i][j] = emb[tok[i]][j];
}
