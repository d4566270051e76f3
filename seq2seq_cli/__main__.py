from seq2seq_cli.cli import main

main()
