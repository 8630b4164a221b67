from ddpdoctor.supervisor.cli import main

main()
