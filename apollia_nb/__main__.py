from apollia_nb.cli import main

raise SystemExit(main())
