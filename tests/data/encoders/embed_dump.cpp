// llama.cpp's embeddings for pyllama's encoder tests (tests/data/encoders/make_reference.py
// builds and runs this; llama-embedding's printed output loses parts of long lines, its
// log being asynchronous, so the vectors are written here in binary).
//   embed_dump MODEL POOLING OUT.f32 IN.txt [FLASH_ATTN]
// IN.txt: one text per line (\t and \n escaped as \\t and \\n, a backslash as \\\\). Each
// text is tokenized as llama-embedding does (add_special, parse_special) and its ids are
// printed on stdout (one line per text); all texts are embedded together as one batch of
// sequences (seq i = text i), as llama-embedding's batch_decode runs them: llama_encode for
// encoder-only models, else llama_decode. Context: n_ctx 512, n_batch = n_ubatch = 504,
// unified KV cache, 2 threads, POOLING (-1 = the model's), FLASH_ATTN (llama_flash_attn_type:
// default 0 = off, llama.cpp's f32 attention for the encoders; -1 = auto, its default, which
// the decoders use). OUT gets
// float32 rows: per text, its pooled vector (n_embd; n_cls_out scores with rank pooling) or,
// with pooling none, one row per token.
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

static std::string unescape(const std::string & s) {
    std::string o;
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] == '\\' && i + 1 < s.size()) {
            char c = s[++i];
            o += c == 't' ? '\t' : c == 'n' ? '\n' : c;
        } else {
            o += s[i];
        }
    }
    return o;
}

int main(int argc, char ** argv) {
    if (argc != 5 && argc != 6) { fprintf(stderr, "usage: %s MODEL POOLING OUT.f32 IN.txt [FLASH_ATTN]\n", argv[0]); return 1; }
    llama_backend_init();
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) { fprintf(stderr, "model load failed\n"); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::vector<std::vector<llama_token>> seqs;
    std::ifstream in(argv[4]);
    std::string line;
    size_t n_total = 0;
    while (std::getline(in, line)) {
        std::string text = unescape(line);
        std::vector<llama_token> t(text.size() + 8);
        int n = llama_tokenize(vocab, text.c_str(), (int) text.size(), t.data(), (int) t.size(), true, true);
        if (n < 0) { fprintf(stderr, "tokenize failed\n"); return 2; }
        t.resize(n);
        for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", t[i]);
        printf("\n");
        n_total += n;
        seqs.push_back(t);
    }
    auto cp = llama_context_default_params();
    // n_ubatch a multiple of the 7 and 3 sequences used: llama.cpp 0c1e570 reserves its mean-pooling
    // graph with n_tokens rounded up to a multiple of n_seqs and then fails an assertion otherwise
    cp.n_ctx = 512; cp.n_batch = 504; cp.n_ubatch = 504; cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.n_seq_max = (uint32_t) seqs.size(); cp.kv_unified = true; cp.embeddings = true;
    cp.flash_attn_type = (enum llama_flash_attn_type) (argc == 6 ? atoi(argv[5]) : 0);
    cp.pooling_type = (enum llama_pooling_type) atoi(argv[2]);
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "context failed\n"); return 1; }
    llama_batch b = llama_batch_init((int) n_total, 0, 1);
    for (size_t s = 0; s < seqs.size(); s++) {
        for (size_t i = 0; i < seqs[s].size(); i++) {
            int k = b.n_tokens++;
            b.token[k] = seqs[s][i]; b.pos[k] = (llama_pos) i; b.n_seq_id[k] = 1; b.seq_id[k][0] = (llama_seq_id) s;
            b.logits[k] = 1;
        }
    }
    int rc = (llama_model_has_encoder(model) && !llama_model_has_decoder(model)) ? llama_encode(ctx, b) : llama_decode(ctx, b);
    if (rc != 0) { fprintf(stderr, "encode/decode failed: %d\n", rc); return 3; }
    const int n_embd = llama_model_n_embd_out(model);
    const enum llama_pooling_type pt = llama_pooling_type(ctx);
    const int width = pt == LLAMA_POOLING_TYPE_RANK ? (int) llama_model_n_cls_out(model) : n_embd;
    FILE * f = fopen(argv[3], "wb");
    int k = 0;
    for (size_t s = 0; s < seqs.size(); s++) {
        if (pt == LLAMA_POOLING_TYPE_NONE) {
            for (size_t i = 0; i < seqs[s].size(); i++, k++) fwrite(llama_get_embeddings_ith(ctx, k), 4, n_embd, f);
        } else {
            fwrite(llama_get_embeddings_seq(ctx, (llama_seq_id) s), 4, width, f);
        }
    }
    fclose(f);
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
