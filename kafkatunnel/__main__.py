from kafkatunnel.cli import app

app()
