from kafkatunnel.cli import main

main()
