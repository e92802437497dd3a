/* mtp.c — the MTP head's forward (spec §5) from forward_cpu's building blocks: row layout, embedding, the
 * decoder layer (gated attention + MLP/MoE) and the norms are the main model's own code, so the head's layer
 * computes exactly what a full-attention layer of the model would. */
#include "model/mtp.h"

#include <string.h>

#include "backend/cpu/matmul.h"

size_t mtp_scratch_floats(const model *m, int max_tokens) {
    return (size_t)max_tokens * 2 * (size_t)m->H;
}

int mtp_logit_rows(const fwd_entry *e, const mtp_io *io, int n_entries) {
    int rows = 0;
    for (int i = 0; i < n_entries; i++) rows += io[i].logits == 2 ? e[i].n : io[i].logits ? 1 : 0;
    return rows;
}

void forward_mtp(const model *m, fwd_scratch *s, kv_pool *kv, threadpool *tp, const fwd_entry *e,
                 const mtp_io *io, int n_entries, float *cat, int n_vocab, float *logits) {
    const mtp_weights *w = &m->mtp;
    int H = m->H;
    float eps = (float)m->cfg.rms_norm_eps;
    int T = fwd_rows_begin(s, e, n_entries);
    fwd_embed_rows(m, s, tp, T);
    /* the fc input per row: [normed embedding | normed hidden], embedding first (spec §5); the two norms go
     * through s->xn and s->out, then interleave into cat [T][2H] */
    fwd_rmsnorm_rows(tp, s->xn, s->x, w->pre_fc_norm_embedding, T, H, eps);
    for (int i = 0; i < n_entries; i++)
        fwd_rmsnorm_rows(tp, s->out + (size_t)s->entry_row0[i] * H, io[i].hidden, w->pre_fc_norm_hidden,
                         e[i].n, H, eps);
    for (int r = 0; r < T; r++) {
        memcpy(cat + (size_t)r * 2 * H, s->xn + (size_t)r * H, sizeof(float) * (size_t)H);
        memcpy(cat + (size_t)r * 2 * H + H, s->out + (size_t)r * H, sizeof(float) * (size_t)H);
    }
    cpu_matmul(tp, s->x, cat, w->fc.data, w->fc.type, T, w->fc.rows, w->fc.cols);
    fwd_decoder_layer(m, s, kv, NULL, tp, e, n_entries, T, &w->layer, -1, 0);
    /* every row's normed output (the next chained step's hh), then the rows that need logits */
    fwd_rmsnorm_rows(tp, s->xn, s->x, w->norm, T, H, eps);
    int nl = 0;
    for (int i = 0; i < n_entries; i++) {
        int r0 = s->entry_row0[i], n = e[i].n;
        if (io[i].hidden_out) memcpy(io[i].hidden_out, s->xn + (size_t)r0 * H, sizeof(float) * (size_t)n * H);
        if (!io[i].logits) continue;
        int first = io[i].logits == 2 ? r0 : r0 + n - 1;
        for (int r = first; r < r0 + n; r++)
            memcpy(s->lrows + (size_t)nl++ * H, s->xn + (size_t)r * H, sizeof(float) * (size_t)H);
    }
    /* lm_head rows are token ids: a draft vocabulary [0, n_vocab) is a prefix of the matrix */
    if (nl) cpu_matmul(tp, logits, s->lrows, m->lm_head.data, m->lm_head.type, nl, n_vocab, m->lm_head.cols);
}
