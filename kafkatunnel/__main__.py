from kafkatunnel.cli.main import main

main()
