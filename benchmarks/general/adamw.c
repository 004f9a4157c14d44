/* AdamW step t as llm.c writes it: decoupled weight decay, in parallel. */
void adamw(int N, int t, float w[N], float m[N], float v[N], const float g[N], float lr,
           float beta1, float beta2, float eps, float weight_decay) {
  #pragma omp parallel for
  for (int i = 0; i < N; i++) {
    float m_new = beta1 * m[i] + (1.0f - beta1) * g[i];
    float v_new = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
    m[i] = m_new;
    v[i] = v_new;
    float m_hat = m_new / (1.0f - powf(beta1, t));
    float v_hat = v_new / (1.0f - powf(beta2, t));
    w[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * w[i]);
  }
}
