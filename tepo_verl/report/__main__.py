from tepo_verl.report.compare import main

raise SystemExit(main())
