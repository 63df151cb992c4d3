"""Write two toy UGM (tokenizer.ggml.model = "t5") vocabularies for crosscheck-t5-toy-{a,b}:
llama.cpp's llama-spm vocabulary re-labelled as T5 (its scores serve as unigram scores),
plus four user-defined tokens and one token marked unused; "a" with add_space_prefix and
remove_extra_whitespaces, "b" with neither. No precompiled_charsmap (nomic-bert-moe's
real vocabulary covers that).
tests/tokenizer/test_tokenizer.py::t5_toy_metadata builds the same metadata in memory.

    python make_t5_toy.py   (writes t5-a.gguf and t5-b.gguf here; then make_crosscheck.py)
"""
import sys
from pyllama import _core
import gguf
src = sys.argv[1] if len(sys.argv) > 1 else 'llama.cpp/models/ggml-vocab-llama-spm.gguf'
md = _core.GGUFFile(src, 'auto').metadata()
def write(path, add_prefix, remove_ws, extra_user=("<ud>", "ab cd", "zqzq", "▁hello▁world▁")):
    w = gguf.GGUFWriter(path, 'llama')
    w.add_name('t5-toy')
    w.add_block_count(md['llama.block_count']); w.add_context_length(md['llama.context_length'])
    w.add_embedding_length(md['llama.embedding_length']); w.add_feed_forward_length(md['llama.feed_forward_length'])
    w.add_head_count(md['llama.attention.head_count']); w.add_head_count_kv(md['llama.attention.head_count_kv'])
    w.add_layer_norm_rms_eps(md['llama.attention.layer_norm_rms_epsilon']); w.add_rope_dimension_count(128)
    w.add_vocab_size(32000 + len(extra_user))
    w.add_tokenizer_model('t5')
    toks = list(md['tokenizer.ggml.tokens']) + list(extra_user)
    types = list(md['tokenizer.ggml.token_type']) + [4] * len(extra_user)
    scores = list(md['tokenizer.ggml.scores']) + [0.0] * len(extra_user)
    # some tokens unused / control to exercise the matcher
    types[500] = 5
    w.add_token_list(toks); w.add_token_scores(scores); w.add_token_types(types)
    w.add_eos_token_id(2); w.add_unk_token_id(0); w.add_pad_token_id(0)
    w.add_add_space_prefix(add_prefix); w.add_remove_extra_whitespaces(remove_ws)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
write('t5-a.gguf', True, True)
write('t5-b.gguf', False, False)
