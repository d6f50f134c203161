"""`python -m hf_headattn`: the package's commands, each with its own `--help`."""

COMMANDS = """hf_headattn's commands (each also `python -m hf_headattn.commands.NAME`; COMMAND --help for its flags):

  hf-headattn-train      (train)      train a translation model with Seq2SeqTrainer
  hf-headattn-translate  (translate)  translate a file or stdin; n-best lists, scores, word alignments
  hf-headattn-evaluate   (evaluate)   translate a test set; BLEU, chrF, TER, REP, DROP, BLEU by length
  hf-headattn-average    (average)    average the weights of a run's last checkpoints into a model folder
  hf-headattn-export     (export)     a softmax model as a CTranslate2 model, float32 or int8
  hf-headattn-plot       (plot)       attention maps, DHICM head importances, BLEU by length
  hf-headattn-hub        (hub)        model card from an evaluation; upload a folder to the Hub; a Gradio Space
  hf-headattn-demo       (demo)       train and translate on a toy corpus, offline (writes runs/demo)
  hf-headattn-app        (app)        a web page: translate with two models side by side, see their attention
"""

if __name__ == "__main__":
    print(COMMANDS, end="")
