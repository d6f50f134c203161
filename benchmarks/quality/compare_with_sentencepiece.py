"""Diagnostic beside benchmark_quality.py: how close the training command's tokenizer is to a SentencePiece BPE
of the same size (the usual meaning of the anchor's "joint BPE of 8,000"). Trains SentencePiece BPE on the
joint training text (NFKC, full character coverage, as the command's tokenizer normalises) and reports, per
file, the share of sentences that both segment into the same pieces, the mean pieces per sentence, and the
pieces the two vocabularies share. Needs `pip install sentencepiece` (not a dependency of the package).

    python benchmarks/quality/compare_with_sentencepiece.py --tokenizer runs/quality/transformer-softmax/seed-1
"""

import argparse
import json
import tempfile
from pathlib import Path

from hf_headattn.tokenization import load_tokenizer
from hf_headattn.parallel_data import read_parallel_files
from hf_headattn.training import multi30k_paths


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True, help="a tokenizer folder (e.g. a benchmark run's model)")
    parser.add_argument("--data-dir", default="../shared/data/multi30k")
    args = parser.parse_args()
    try:
        import sentencepiece
    except ImportError:
        parser.error("this comparison needs SentencePiece: pip install sentencepiece")

    tokenizer = load_tokenizer(args.tokenizer)
    paths = multi30k_paths(args.data_dir)
    train = read_parallel_files(paths["train.de"], paths["train.en"], skip_empty=True)
    with tempfile.TemporaryDirectory() as folder:
        joint = Path(folder) / "joint.txt"
        joint.write_text("\n".join([*train["source"], *train["target"]]) + "\n", encoding="utf-8")
        sentencepiece.SentencePieceTrainer.train(
            input=str(joint), model_prefix=f"{folder}/bpe", vocab_size=len(tokenizer), model_type="bpe",
            character_coverage=1.0, normalization_rule_name="nfkc", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
            minloglevel=2)
        reference = sentencepiece.SentencePieceProcessor(model_file=f"{folder}/bpe.model")

    def ours(line):
        return tokenizer.convert_ids_to_tokens(tokenizer(line, add_special_tokens=False).input_ids)

    report = {}
    for name in ("train.de", "train.en", "test_2016_flickr.de"):
        lines = [line for line in paths[name].read_text(encoding="utf-8").split("\n") if line]
        segmentations = [(ours(line), reference.encode(line, out_type=str)) for line in lines]
        report[name] = {
            "sentences": len(lines),
            "same_segmentation": round(sum(a == b for a, b in segmentations) / len(lines), 4),
            "pieces_per_sentence": round(sum(len(a) for a, _ in segmentations) / len(lines), 3),
            "sentencepiece_pieces_per_sentence": round(sum(len(b) for _, b in segmentations) / len(lines), 3),
        }
    sentencepiece_vocabulary = {reference.id_to_piece(i) for i in range(reference.get_piece_size())}
    report["shared_pieces"] = len(set(tokenizer.get_vocab()) & sentencepiece_vocabulary)
    report["vocabulary_size"] = len(tokenizer)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
