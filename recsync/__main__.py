from recsync.cli import main

main()
