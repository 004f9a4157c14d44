/* RNA folding (Nussinov): maximum base pairs; seq holds bases 0..3, a pair sums to 3. */
void nussinov(int N, const double seq[N], double table[N][N]) {
  for (int i = N - 1; i >= 0; i--) {
    for (int j = i + 1; j < N; j++) {
      if (j - 1 >= 0)
        table[i][j] = fmax(table[i][j], table[i][j - 1]);
      if (i + 1 < N)
        table[i][j] = fmax(table[i][j], table[i + 1][j]);
      if (j - 1 >= 0 && i + 1 < N) {
        if (i < j - 1)
          table[i][j] = fmax(table[i][j], table[i + 1][j - 1] + (seq[i] + seq[j] == 3.0 ? 1.0 : 0.0));
        else
          table[i][j] = fmax(table[i][j], table[i + 1][j - 1]);
      }
      for (int k = i + 1; k < j; k++)
        table[i][j] = fmax(table[i][j], table[i][k] + table[k + 1][j]);
    }
  }
}
