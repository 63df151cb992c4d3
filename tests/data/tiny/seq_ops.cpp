// llama.cpp's answers to a script of multi-sequence batches and sequence operations, for
// pyllama's tests/models/test_recurrent.py (make_seq_ops_reference.py builds and runs this).
//   seq_ops MODEL OUT.f32 N_SEQ_MAX [N_RS_SEQ [N_UBATCH]] < SCRIPT
// Script lines (the same interpreter is in tests/models/test_recurrent.py):
//   decode S:T,T,...;S:T,...   one batch: each sequence's tokens, contiguous, at positions
//                              continuing llama_memory_seq_pos_max + 1, logits for the last
//                              token of each; prints "decode RET" and appends the rows to OUT
//   rm S P0 P1 | cp S D P0 P1 | keep S | add S P0 P1 D | div S P0 P1 D
//   pos S                      prints "pos S MIN MAX"
//   save S                     keeps llama_state_seq_get_data of S (S = -1: llama_state_get_data)
//   load S D                   llama_state_seq_set_data of what `save S` kept into D (S = -1:
//                              llama_state_set_data, D ignored); prints "load 1" (restored) or "load 0"
//   clear                      llama_memory_clear(mem, true)
//   nrs                        prints "nrs N": llama_n_rs_seq
// Context: n_ctx 256, n_batch 256, n_ubatch 512 (or N_UBATCH), n_rs_seq 0 (or N_RS_SEQ), 2 threads,
// default flash attention.
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s MODEL OUT N_SEQ_MAX [N_RS_SEQ [N_UBATCH]] < SCRIPT\n", argv[0]); return 1; }
    llama_backend_init();
    auto mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "model load failed\n"); return 1; }
    auto cp = llama_context_default_params();
    cp.n_ctx = 256; cp.n_batch = 256; cp.n_ubatch = 512; cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.n_seq_max = (uint32_t) atoi(argv[3]);
    if (argc > 4) cp.n_rs_seq = (uint32_t) atoi(argv[4]);
    if (argc > 5) cp.n_ubatch = (uint32_t) atoi(argv[5]);
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "context failed\n"); return 1; }
    llama_memory_t mem = llama_get_memory(ctx);
    const int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * f = fopen(argv[2], "wb");
    std::map<int, std::vector<uint8_t>> saved;
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string op;
        in >> op;
        if (op.empty()) continue;
        if (op == "decode") {
            std::string spec;
            in >> spec;
            std::vector<std::pair<int, std::vector<int>>> seqs;
            std::stringstream ss(spec);
            std::string part;
            while (std::getline(ss, part, ';')) {
                auto c = part.find(':');
                int s = atoi(part.substr(0, c).c_str());
                std::vector<int> toks;
                std::stringstream ts(part.substr(c + 1));
                std::string t;
                while (std::getline(ts, t, ',')) toks.push_back(atoi(t.c_str()));
                seqs.push_back({s, toks});
            }
            int n = 0;
            for (auto & p : seqs) n += (int) p.second.size();
            llama_batch b = llama_batch_init(n, 0, 1);
            int k = 0;
            std::vector<int> last;
            for (auto & p : seqs) {
                llama_pos p0 = llama_memory_seq_pos_max(mem, p.first) + 1;
                for (size_t j = 0; j < p.second.size(); j++, k++) {
                    b.token[k] = p.second[j]; b.pos[k] = p0 + (llama_pos) j; b.n_seq_id[k] = 1;
                    b.seq_id[k][0] = p.first; b.logits[k] = j + 1 == p.second.size();
                }
                last.push_back(k - 1);
            }
            b.n_tokens = n;
            int ret = llama_decode(ctx, b);
            printf("decode %d\n", ret);
            if (ret == 0) {
                for (int i : last) fwrite(llama_get_logits_ith(ctx, i), sizeof(float), nv, f);
            }
            llama_batch_free(b);
        } else if (op == "rm") {
            int s, p0, p1; in >> s >> p0 >> p1;
            printf("rm %d\n", llama_memory_seq_rm(mem, s, p0, p1) ? 1 : 0);
        } else if (op == "cp") {
            int s, d, p0, p1; in >> s >> d >> p0 >> p1;
            llama_memory_seq_cp(mem, s, d, p0, p1);
        } else if (op == "keep") {
            int s; in >> s;
            llama_memory_seq_keep(mem, s);
        } else if (op == "add") {
            int s, p0, p1, d; in >> s >> p0 >> p1 >> d;
            llama_memory_seq_add(mem, s, p0, p1, d);
        } else if (op == "div") {
            int s, p0, p1, d; in >> s >> p0 >> p1 >> d;
            llama_memory_seq_div(mem, s, p0, p1, d);
        } else if (op == "pos") {
            int s; in >> s;
            printf("pos %d %d %d\n", s, llama_memory_seq_pos_min(mem, s), llama_memory_seq_pos_max(mem, s));
        } else if (op == "save") {
            int s; in >> s;
            auto & buf = saved[s];
            if (s < 0) {
                buf.resize(llama_state_get_size(ctx));
                buf.resize(llama_state_get_data(ctx, buf.data(), buf.size()));
            } else {
                buf.resize(llama_state_seq_get_size(ctx, s));
                buf.resize(llama_state_seq_get_data(ctx, buf.data(), buf.size(), s));
            }
        } else if (op == "load") {
            int s, d; in >> s >> d;
            auto & buf = saved.at(s);
            size_t n = s < 0 ? llama_state_set_data(ctx, buf.data(), buf.size())
                             : llama_state_seq_set_data(ctx, buf.data(), buf.size(), d);
            printf("load %d\n", n == buf.size() ? 1 : 0);
        } else if (op == "clear") {
            llama_memory_clear(mem, true);
        } else if (op == "nrs") {
            printf("nrs %u\n", llama_n_rs_seq(ctx));
        } else {
            fprintf(stderr, "bad op %s\n", op.c_str()); return 1;
        }
        fflush(stdout);
    }
    fclose(f);
    llama_free(ctx); llama_model_free(model);
    return 0;
}
