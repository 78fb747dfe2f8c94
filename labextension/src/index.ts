/**
 * The apollia side panel for JupyterLab 4: a right-sidebar panel with the inbox of waiting
 * decisions, the agents and runs, and the journal of the current notebook's kernel.
 */

import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, Notification } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { LabIcon } from '@jupyterlab/ui-components';

import apolliaSvg from '../style/apollia.svg';
import { ApolliaPanel } from './panel';
import { notificationText } from './format';
import { NotificationBook, itemKey } from './state';

export const PLUGIN_ID = '@apollia/nb-panel:plugin';
export const COMMAND_OPEN = 'apollia:open-panel';

export { notificationText };

export const apolliaIcon = new LabIcon({ name: 'apollia:icon', svgstr: apolliaSvg });



const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'The apollia side panel: the inbox, agents and runs, and the journal of the kernel.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, ILabShell],
  activate: (app: JupyterFrontEnd, tracker: INotebookTracker, palette: ICommandPalette | null, labShell: ILabShell | null) => {
    const open = () => {
      if (!panel.isAttached) {
        app.shell.add(panel, 'right', { rank: 600 });
      }
      app.shell.activateById(panel.id);
      panel.node.focus();
    };
    const book = new NotificationBook();
    const panel: ApolliaPanel = new ApolliaPanel({
      notify: items => {
        const id = Notification.info(notificationText(items), {
          autoClose: 10_000,
          actions: [{ label: 'Open the panel', callback: () => open(), displayType: 'accent' }]
        });
        book.add(id, items.map(itemKey));
      },
      dismiss: keys => {
        for (const id of book.answered(keys)) {
          Notification.dismiss(id);
        }
      },
      badge: count => {
        panel.title.caption = count > 0 ? `apollia: ${count} decision${count === 1 ? '' : 's'} waiting` : 'apollia';
        panel.title.dataset = count > 0 ? { 'apollia-waiting': String(count) } : {};
        panel.title.className = count > 0 ? 'apollia-tab apollia-tab-waiting' : 'apollia-tab';
      }
    });
    panel.title.icon = apolliaIcon;
    panel.title.caption = 'apollia';
    panel.title.className = 'apollia-tab';
    app.shell.add(panel, 'right', { rank: 600 });

    app.commands.addCommand(COMMAND_OPEN, {
      label: 'Open the apollia panel',
      caption: 'The inbox of waiting decisions, the agents and runs, and the journal of the kernel',
      icon: apolliaIcon,
      execute: open
    });
    palette?.addItem({ command: COMMAND_OPEN, category: 'apollia' });

    const follow = (nb: NotebookPanel | null) => {
      panel.follow(nb ? nb.sessionContext : null, nb ? nb.context.path : null);
    };
    tracker.currentChanged.connect((_, nb) => follow(nb));
    follow(tracker.currentWidget);
    // The tracker's current notebook stays current while another kind of tab is focused:
    // the panel keeps showing that notebook's kernel.
    void labShell;
  }
};

export default plugin;
