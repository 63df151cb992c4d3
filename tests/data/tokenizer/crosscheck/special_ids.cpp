// Writes what llama.cpp loads for each vocabulary: special ids, add_* flags, the EOG set and a
// hash of all token attributes (special_ids.json was made from its output; build as harness.cpp).
#include "llama.h"
#include <cstdio>
int main(int argc, char ** argv) {
    llama_backend_init();
    llama_log_set([](enum ggml_log_level, const char *, void *) {}, nullptr);
    auto mp = llama_model_default_params(); mp.vocab_only = true;
    for (int i = 1; i < argc; i++) {
        llama_model * m = llama_model_load_from_file(argv[i], mp);
        if (!m) { printf("%s: load failed\n", argv[i]); continue; }
        const llama_vocab * v = llama_model_get_vocab(m);
        int n = llama_vocab_n_tokens(v), neog = 0;
        printf("%s bos %d eos %d eot %d sep %d nl %d pad %d mask %d fim %d %d %d %d %d %d add_bos %d add_eos %d add_sep %d eog:",
               argv[i], llama_vocab_bos(v), llama_vocab_eos(v), llama_vocab_eot(v), llama_vocab_sep(v), llama_vocab_nl(v),
               llama_vocab_pad(v), llama_vocab_mask(v), llama_vocab_fim_pre(v), llama_vocab_fim_suf(v), llama_vocab_fim_mid(v),
               llama_vocab_fim_pad(v), llama_vocab_fim_rep(v), llama_vocab_fim_sep(v),
               llama_vocab_get_add_bos(v), llama_vocab_get_add_eos(v), llama_vocab_get_add_sep(v));
        for (int t = 0; t < n; t++) if (llama_vocab_is_eog(v, t)) { printf(" %d", t); neog++; }
        long attr_sum = 0; for (int t = 0; t < n; t++) attr_sum = attr_sum * 31 + llama_vocab_get_attr(v, t), attr_sum %= 1000000007;
        printf(" | attrhash %ld\n", attr_sum);
        llama_model_free(m);
    }
}
